package reports

import (
	"bufio"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// writeBigRun writes a DEFT-like run of n steps (threshold, layer_k and ops
// in every record, an evaluation every 1,000 steps) into dir.
func writeBigRun(t testing.TB, dir string, n int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	info := map[string]any{"config": map[string]any{"model": "resnet18", "dataset": "cifar10", "sparsifier": "micro", "density": 0.01,
		"workers": 16, "seed": 1, "device": "cpu"}, "workers": 16, "backend": "local"}
	b, _ := json.Marshal(info)
	if err := os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	rng := rand.New(rand.NewPCG(1, 2))
	lk := make([]int, 62)
	for i := 1; i <= n; i++ {
		for j := range lk {
			lk[j] = rng.IntN(100)
		}
		lkb, _ := json.Marshal(lk)
		x := float64(i)
		w.WriteString(`{"type":"step","epoch":` + strconv.Itoa(i/400+1) + `,"step":` + strconv.Itoa(i) +
			`,"loss":` + g(2.3*math.Exp(-x/30000)+0.1*rng.Float64()) + `,"lr":0.1,"density":0.01,"actual_density":` + g(0.01*(1+0.2*rng.Float64())) +
			`,"error_norm":` + g(1+rng.Float64()) + `,"threshold":` + g(0.001*(1+0.1*rng.Float64())) +
			`,"bytes_sent":` + g(1e6*(1+rng.Float64())) + `,"bytes_recv":` + g(1.5e7*(1+rng.Float64())) +
			`,"t_forward":0.01,"t_backward":` + g(0.02*(1+rng.Float64())) + `,"t_select":0.003,"t_comm":` + g(0.005*rng.Float64()) +
			`,"t_update":0.001,"t_iter":0.05,"t_wait":0.001,"t_compute":0.03,"samples":512,"workers":16,"wall":` + g(0.05*x) +
			`,"layer_k":` + string(lkb) +
			`,"ops":{"allgather":{"calls":1,"elements":20000,"bytes_sent":1200000,"bytes_recv":1200000,"time":0.004},"allreduce":{"calls":2,"elements":3,"bytes_sent":22,"bytes_recv":22,"time":0.0002}}}` + "\n")
		if i%1000 == 0 {
			w.WriteString(`{"type":"eval","epoch":` + strconv.Itoa(i/400+1) + `,"step":` + strconv.Itoa(i) + `,"wall":` + g(0.05*x) +
				`,"metric":"accuracy","value":` + g(0.9*(1-math.Exp(-x/20000))) + "}\n")
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func g(x float64) string { return strconv.FormatFloat(x, 'g', 8, 64) }
