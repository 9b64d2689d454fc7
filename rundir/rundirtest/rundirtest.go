// Package rundirtest reads a run's folder the way tests compare runs: where
// a run ended (its newest checkpoint, byte for byte, and its metrics
// without the times), so that a run stopped and resumed, or run another
// way (under mpirun, with simulated workers), can be checked bit for bit
// against one that was not.
package rundirtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/rundir"
)

// End is where a run ended: its newest complete checkpoint (the shared
// part's training state and every rank's part) and its metrics records
// without the fields that measure time.
type End struct {
	Step     int
	Params   []float32
	Opt      [][]float32
	OptSteps int64
	// Shards are the bytes of every rank's part, by rank; Residuals the
	// error-feedback residuals they hold.
	Shards    [][]byte
	Residuals [][]float32
	// Models are the ranks' model states (their dropout streams), by rank.
	Models  [][]byte
	Records []map[string]any
}

// Read reads where the run in the folder dir ended; a problem fails t.
func Read(t testing.TB, dir string) End {
	t.Helper()
	ckd, err := rundir.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := rundir.ReadCheckpoint[json.RawMessage](ckd)
	if err != nil {
		t.Fatal(err)
	}
	e := End{Step: ck.Step, Params: ck.Params, Opt: ck.Opt, OptSteps: ck.OptSteps}
	for r := range ck.Workers {
		b, err := os.ReadFile(filepath.Join(ckd, rundir.ShardFile(r)))
		if err != nil {
			t.Fatal(err)
		}
		sh, err := ck.ReadShard(ckd, r)
		if err != nil {
			t.Fatal(err)
		}
		e.Shards, e.Residuals = append(e.Shards, b), append(e.Residuals, sh.Residual)
		e.Models = append(e.Models, sh.Model)
	}
	for _, rec := range Records(t, dir) {
		for k := range rec {
			if k == "wall" || strings.HasPrefix(k, "t_") {
				delete(rec, k)
			}
		}
		if ops, ok := rec["ops"].(map[string]any); ok {
			for _, o := range ops {
				delete(o.(map[string]any), "time")
			}
		}
		e.Records = append(e.Records, rec)
	}
	return e
}

// Diff says how two ends differ, the first difference found ("" when
// they do not): the step, the bits of the parameters and of the optimizer
// state, every rank's part byte for byte, every record.
func Diff(a, b End) string {
	bits := func(x, y []float32) bool {
		return slices.EqualFunc(x, y, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })
	}
	switch {
	case a.Step != b.Step:
		return fmt.Sprintf("last checkpoint at step %d vs %d", a.Step, b.Step)
	case !bits(a.Params, b.Params):
		return "parameters differ"
	case a.OptSteps != b.OptSteps || !slices.EqualFunc(a.Opt, b.Opt, bits):
		return "optimizer state differs"
	}
	if len(a.Shards) != len(b.Shards) {
		return fmt.Sprintf("%d ranks' parts vs %d", len(a.Shards), len(b.Shards))
	}
	for r := range a.Shards {
		if !bytes.Equal(a.Shards[r], b.Shards[r]) {
			return fmt.Sprintf("rank %d's part (residual, batch-norm statistics, reducer or model state) differs", r)
		}
	}
	if len(a.Records) != len(b.Records) {
		return fmt.Sprintf("%d metrics records vs %d", len(a.Records), len(b.Records))
	}
	for i := range a.Records {
		if !reflect.DeepEqual(a.Records[i], b.Records[i]) {
			return fmt.Sprintf("metrics record %d differs:\n%v\n%v", i, a.Records[i], b.Records[i])
		}
	}
	return ""
}

// Records are the records of the metrics.jsonl of the run in dir; a
// problem (a line that is not JSON) fails t.
func Records(t testing.TB, dir string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad metrics line %q: %v", sc.Text(), err)
		}
		recs = append(recs, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// OpStep is one step record's statistics of one communication operation.
type OpStep struct {
	Step     int
	Calls    int
	Elements int
	Time     float64 // seconds
}

// OpSteps returns the statistics of operation op (e.g. "allreduce") in
// each step record of dir's metrics.jsonl; it fails t when there is none.
func OpSteps(t testing.TB, dir, op string) []OpStep {
	t.Helper()
	var out []OpStep
	for _, r := range Records(t, dir) {
		if r["type"] != "step" {
			continue
		}
		s := OpStep{Step: int(num(r["step"]))}
		if ops, ok := r["ops"].(map[string]any); ok {
			if o, ok := ops[op].(map[string]any); ok {
				s.Calls, s.Elements, s.Time = int(num(o["calls"])), int(num(o["elements"])), num(o["time"])
			}
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no step records", dir)
	}
	return out
}

// num is a JSON number decoded into an any (0 when absent).
func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
