package sweep

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/reports"
)

// JobsFile is the file in a sweep's folder that lists the mpirun jobs
// train sweep -dry-run printed (WriteJobs). While it is there, train sweep
// builds the page from those jobs' runs instead of running the grid in
// its own process.
const JobsFile = "jobs.json"

// Jobs are the grid's points as mpirun jobs: one process per worker on
// the real network, so the grid's emulated networks collapse into one job
// per method, worker count and density (its Name drops the network's
// label, its Net is zero).
func (s Spec) Jobs() ([]Point, []Skipped, error) {
	pts, skipped, err := s.Points()
	if err != nil {
		return nil, nil, err
	}
	var jobs []Point
	seen := map[string]bool{}
	for _, p := range pts {
		p.Name = strings.TrimSuffix(p.Name, "-"+NetLabel(p.Net))
		if seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		p.Net = netmodel.Network{}
		p.Config.NetBandwidth, p.Config.NetLatency = 0, 0
		jobs = append(jobs, p)
	}
	var sk []Skipped
	for _, k := range skipped {
		for _, n := range s.Networks {
			k.Name = strings.TrimSuffix(k.Name, "-"+NetLabel(n))
		}
		if !seen[k.Name] {
			seen[k.Name] = true
			sk = append(sk, k)
		}
	}
	return jobs, sk, nil
}

// jobsList is the content of JobsFile.
type jobsList struct {
	Jobs []jobEntry `json:"jobs"`
}

type jobEntry struct {
	Name    string  `json:"name"`
	Method  string  `json:"method"`
	Workers int     `json:"workers"`
	Density float64 `json:"density"`
}

// WriteJobs records in out/JobsFile the jobs of s (Jobs), printed by train
// sweep -dry-run, whose runs write into out/runs/NAME.
func WriteJobs(out string, s Spec) error {
	jobs, _, err := s.Jobs()
	if err != nil {
		return err
	}
	var l jobsList
	for _, j := range jobs {
		l.Jobs = append(l.Jobs, jobEntry{j.Name, j.Method, j.Workers, j.Density})
	}
	if err := os.MkdirAll(filepath.Join(out, "runs"), 0o755); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	if err := atomicfile.WriteJSON(filepath.Join(out, JobsFile), l); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return nil
}

// jobPoints returns the points of the jobs out/JobsFile lists when it
// exists (ok), after checking that they are the jobs of s and that every
// one of them has finished its run in out/runs. A job not run, still
// running or unfinished is refused with what to do.
func jobPoints(s Spec, out string) (pts []Point, unrunnable []Skipped, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(out, JobsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, true, fmt.Errorf("sweep: %w", err)
	}
	var l jobsList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, nil, true, fmt.Errorf("sweep: %s is damaged (%v); delete it and print the jobs again with -dry-run", filepath.Join(out, JobsFile), err)
	}
	jobs, unrunnable, err := s.Jobs()
	if err != nil {
		return nil, nil, true, err
	}
	fix := fmt.Sprintf("run the jobs (-dry-run prints them again) and then this command, or delete %s to run the grid in this process instead (emulated networks)", filepath.Join(out, JobsFile))
	same := len(jobs) == len(l.Jobs)
	for i := 0; same && i < len(jobs); i++ {
		j, e := jobs[i], l.Jobs[i]
		same = j.Name == e.Name && j.Method == e.Method && j.Workers == e.Workers && j.Density == e.Density
	}
	if !same {
		return nil, nil, true, fmt.Errorf("sweep: %s lists other jobs than this grid's (printed by -dry-run with other flags); give the flags of that -dry-run, or delete %s to run this grid in this process", out, filepath.Join(out, JobsFile))
	}
	var missing []string
	for _, j := range jobs {
		dir := filepath.Join(out, "runs", j.Name)
		r, err := reports.ReadRun(dir)
		if err != nil {
			missing = append(missing, j.Name+" (no run there yet)")
			continue
		}
		c := r.Info.Config
		switch st := r.Info.Status; {
		case c.Sparsifier != j.Config.Sparsifier || r.Info.Workers != j.Workers || (j.Config.Sparsifier != "dense" && c.Density != j.Density):
			return nil, nil, true, fmt.Errorf("sweep: %s holds a run of %s with %d workers at density %g, not the job's %s with %d at %g; move it away and run the job", dir, c.Sparsifier, r.Info.Workers, c.Density, j.Config.Sparsifier, j.Workers, j.Density)
		case st == metrics.StatusCompleted || st == metrics.StatusStopped:
		default:
			what := st
			switch st {
			case "":
				what = "not known to have finished"
			case metrics.StatusRunning:
				what = "running, or killed"
			}
			missing = append(missing, j.Name+" ("+what+")")
		}
	}
	if len(missing) > 0 {
		return nil, nil, true, fmt.Errorf("sweep: the mpirun jobs printed by -dry-run into %s have not all finished: %s; %s", out, strings.Join(missing, ", "), fix)
	}
	return jobs, unrunnable, true, nil
}
