package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
)

// Num is a float64 that encodes as JSON null when it is NaN or infinite
// (JSON has no such numbers).
type Num float64

// MarshalJSON implements json.Marshaler.
func (x Num) MarshalJSON() ([]byte, error) {
	f := float64(x)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// StepRecord is one line of metrics.jsonl with "type":"step". Epoch is
// 1-based (the epoch the step belongs to); Step counts iterations from 1.
// Bytes are per worker, averaged over workers; times are in seconds, each
// phase's and the iteration's the maximum over workers. TForward runs from
// the start of the step to the first gradient that is final (so it includes
// the backward of the output layer); TBackward the rest of the model's step.
// TSelect and TComm are the reducer's selection and communication times
// (under LAGS pipelining TComm is the sum of the groups' request durations,
// which overlap the backward pass and each other); TWait is the time from
// the end of the backward pass until the averaged gradient was complete;
// TCompute is the model's whole forward and backward step; TCommWall the
// wall time from the start of the reduction (under pipelining: of the first
// group, during the backward pass) until the averaged gradient was complete. TForward and
// TBackward are null when the split is not measured (Config.PhaseTimes).
type StepRecord struct {
	Type          string `json:"type"`
	Epoch         int    `json:"epoch"`
	Step          int    `json:"step"`
	Loss          Num    `json:"loss"`
	LR            Num    `json:"lr"`
	Density       Num    `json:"density"`
	ActualDensity Num    `json:"actual_density"`
	ErrorNorm     Num    `json:"error_norm"`
	Threshold     *Num   `json:"threshold,omitempty"`
	BytesSent     Num    `json:"bytes_sent"`
	BytesRecv     Num    `json:"bytes_recv"`
	TForward      Num    `json:"t_forward"`
	TBackward     Num    `json:"t_backward"`
	TSelect       Num    `json:"t_select"`
	TComm         Num    `json:"t_comm"`
	TUpdate       Num    `json:"t_update"`
	TIter         Num    `json:"t_iter"`
	TWait         Num    `json:"t_wait"`
	TCompute      Num    `json:"t_compute"`
	TCommWall     Num    `json:"t_comm_wall"`
	// LayerK is rank 0's number of selected elements per tensor, for
	// methods that allocate the budget per tensor (absent otherwise).
	LayerK []int `json:"layer_k,omitempty"`
	// Ops are rank 0's communicator counters of the reducer's calls since
	// the previous step record, per operation (comm.Op names).
	Ops     map[string]OpCount `json:"ops,omitempty"`
	Samples int                `json:"samples"`
	Workers int                `json:"workers"`
	Wall    Num                `json:"wall"`
}

// OpCount is the traffic of one communicator operation in a step record.
type OpCount struct {
	Calls     int64 `json:"calls"`
	Elements  int64 `json:"elements"`
	BytesSent int64 `json:"bytes_sent"`
	BytesRecv int64 `json:"bytes_recv"`
	Time      Num   `json:"time"`
}

// EvalRecord is one line of metrics.jsonl with "type":"eval": Metric is
// "accuracy" (fraction), "perplexity", "hr10" or "ndcg10" (fractions), or
// "loss" (the mean evaluation loss).
type EvalRecord struct {
	Type   string `json:"type"`
	Epoch  int    `json:"epoch"`
	Step   int    `json:"step"`
	Wall   Num    `json:"wall"`
	Metric string `json:"metric"`
	Value  Num    `json:"value"`
}

// metricsWriter appends JSON lines to metrics.jsonl and flushes each one.
type metricsWriter struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func openMetrics(path string, appendTo bool) (*metricsWriter, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("train: opening metrics: %w", err)
	}
	return &metricsWriter{f: f, w: bufio.NewWriter(f)}, nil
}

func (m *metricsWriter) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("train: encoding a metrics record: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.w.Write(b)
	m.w.WriteByte('\n')
	if err := m.w.Flush(); err != nil {
		return fmt.Errorf("train: writing metrics: %w", err)
	}
	return nil
}

func (m *metricsWriter) close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		m.f.Close()
		return err
	}
	return m.f.Close()
}
