package train

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
)

// rendezvous is met when all n workers have entered an evaluation.
type rendezvous struct {
	n       int32
	arrived atomic.Int32
	all     chan struct{}
}

// rendezvousModel holds its worker's first evaluation until every worker
// of the run is inside one (or gives up after a while).
type rendezvousModel struct {
	models.Model
	r      *rendezvous
	waited bool
}

func (m *rendezvousModel) SaveState() ([]byte, error) { return m.Model.(models.Stateful).SaveState() }
func (m *rendezvousModel) LoadState(b []byte) error   { return m.Model.(models.Stateful).LoadState(b) }

func (m *rendezvousModel) Evaluate(ctx context.Context, b models.Batch, params device.Buffer) (models.EvalResult, error) {
	if !m.waited {
		m.waited = true
		if m.r.arrived.Add(1) == m.r.n {
			close(m.r.all)
		}
		select {
		case <-m.r.all:
		case <-ctx.Done():
			return models.EvalResult{}, ctx.Err()
		case <-time.After(30 * time.Second):
			return models.EvalResult{}, fmt.Errorf("only %d of %d workers entered an evaluation in 30 s: the trainer serialises the in-process workers' evaluations", m.r.arrived.Load(), m.r.n)
		}
	}
	return m.Model.Evaluate(ctx, b, params)
}

// TestEvaluationsAreNotSerialised: the in-process workers evaluate at the
// same time; the trainer holds no lock of its own around a model's
// evaluation (it once held one, graphMu, duplicating the models' lock on
// building graphs, so a whole evaluation of one worker waited for the
// other's). Each worker's first evaluation waits inside Evaluate until all
// three are inside one, which a lock around Evaluate never allows.
func TestEvaluationsAreNotSerialised(t *testing.T) {
	const workers = 3
	c := ncfConfig(t, workers, 2)
	r := &rendezvous{n: workers, all: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := Run(ctx, c, Options{wrapModel: func(m models.Model) models.Model { return &rendezvousModel{Model: m, r: r} }})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-r.all:
	default:
		t.Fatal(errors.New("the run ended without every worker evaluating"))
	}
}
