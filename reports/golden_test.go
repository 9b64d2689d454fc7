package reports

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestGolden compares the ECharts option every chart receives, for the
// synthetic runs of testdata/runs, with testdata/golden/CASE/CHART.json
// (go test -run TestGolden -update rewrites them; review the diff).
func TestGolden(t *testing.T) {
	cases := []struct {
		name string
		runs []string
	}{
		{"run-micro-4w", []string{"micro-4w"}},
		{"run-deft-4w", []string{"deft-4w"}},
		{"run-lstm-topk", []string{"lstm-topk"}},
		{"run-ncf-xss", []string{"ncf-xss"}},
		{"compare-methods", []string{"deft-4w", "deft-8w", "micro-4w"}},
		{"compare-workers", []string{"deft-4w", "deft-8w"}},
		{"run-lags-4w", []string{"lags-4w"}},
		{"compare-lags-deft", []string{"lags-4w", "deft-4w"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runs []*Run
			for _, d := range c.runs {
				runs = append(runs, mustRead(t, td(d)))
			}
			var specs []chartSpec
			if len(runs) == 1 {
				specs = runCharts(runs[0], DefaultMaxPoints)
			} else {
				diff := differing(runs)
				specs = compareCharts(runs, runLabels(runs, diff), len(diff) == 1 && diff[0] == "workers", DefaultMaxPoints)
			}
			dir := filepath.Join("testdata", "golden", c.name)
			var ids []string
			for i := range specs {
				ids = append(ids, specs[i].ID+".json")
				got, err := json.MarshalIndent(specs[i].option(), "", " ")
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, '\n')
				path := filepath.Join(dir, specs[i].ID+".json")
				if *update {
					if err := os.MkdirAll(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("chart %s differs from %s; got:\n%s", specs[i].ID, path, got)
				}
			}
			// No stale golden files: the set of charts is part of the contract.
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var have []string
			for _, e := range ents {
				have = append(have, e.Name())
			}
			slices.Sort(ids)
			if !slices.Equal(have, ids) && !*update {
				t.Errorf("golden files %v, charts %v", have, ids)
			}
		})
	}
}
