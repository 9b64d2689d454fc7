package rundir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
)

// Metrics is a run's metrics.jsonl open for appending (rank 0's): one JSON
// record per line, each flushed as it is written. Its methods may be
// called from several goroutines; a nil *Metrics does nothing.
type Metrics struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

// OpenMetrics opens the metrics.jsonl of the run folder dir: a new one
// (an earlier file is emptied), or the one there to continue it
// (appendTo).
func OpenMetrics(dir string, appendTo bool) (*Metrics, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(dir, MetricsFile), flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening metrics: %w", err)
	}
	return &Metrics{f: f, w: bufio.NewWriter(f)}, nil
}

// Write appends v as one JSON line.
func (m *Metrics) Write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding a metrics record: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.w.Write(b)
	m.w.WriteByte('\n')
	if err := m.w.Flush(); err != nil {
		return fmt.Errorf("writing metrics: %w", err)
	}
	return nil
}

// Sync makes the records written so far durable (before a checkpoint, so
// that the records up to it survive a crash with it).
func (m *Metrics) Sync() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		return err
	}
	return m.f.Sync()
}

// Close closes the file.
func (m *Metrics) Close() error {
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

// TruncateAfter makes metrics.jsonl the record of a run that continues
// after step: the step records after it and the evaluations after it go
// (a run that died after its last checkpoint wrote them, and the resumed
// run writes them again), and so do the evaluations at step when
// evalDue says the resumed run redoes it. Other lines stay, and so does an
// unparsable line other than an unterminated last one (a record cut by a
// crash). It returns the largest wall time kept, whether an evaluation at
// step was kept and the number of lines removed. The file is replaced
// atomically.
func (m *Metrics) TruncateAfter(step int, evalDue bool) (maxWall float64, evaluated bool, dropped int, err error) {
	if m == nil {
		return 0, false, 0, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		return 0, false, 0, err
	}
	path := m.f.Name()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, 0, fmt.Errorf("reading metrics.jsonl to resume: %w", err)
	}
	var kept bytes.Buffer
	for rest := b; len(rest) > 0; {
		line := rest
		terminated := false
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest, terminated = rest[:i], rest[i+1:], true
		} else {
			rest = nil
		}
		var rec struct {
			Type string   `json:"type"`
			Step int      `json:"step"`
			Wall *float64 `json:"wall"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			if terminated {
				kept.Write(line)
				kept.WriteByte('\n')
			} else {
				dropped++ // a record cut short by a crash
			}
			continue
		}
		keep := true
		switch rec.Type {
		case "step":
			keep = rec.Step <= step
		case "eval":
			keep = rec.Step < step || (rec.Step == step && !evalDue)
			evaluated = evaluated || (keep && rec.Step == step)
		}
		if !keep {
			dropped++
			continue
		}
		if rec.Wall != nil && (rec.Type == "step" || rec.Type == "eval") {
			maxWall = max(maxWall, *rec.Wall)
		}
		kept.Write(line)
		kept.WriteByte('\n')
	}
	if dropped == 0 && bytes.Equal(kept.Bytes(), b) {
		return maxWall, evaluated, 0, nil
	}
	if err := atomicfile.WriteFile(path, kept.Bytes()); err != nil {
		return 0, false, 0, fmt.Errorf("rewriting metrics.jsonl to resume: %w", err)
	}
	m.f.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, false, 0, fmt.Errorf("opening metrics: %w", err)
	}
	m.f = f
	m.w.Reset(f)
	return maxWall, evaluated, dropped, nil
}

// EvaluatedAt reports whether the metrics.jsonl of the run folder dir
// records an evaluation at step.
func EvaluatedAt(dir string, step int) bool {
	f, err := os.Open(filepath.Join(dir, MetricsFile))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		var rec struct {
			Type string `json:"type"`
			Step int    `json:"step"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Type == "eval" && rec.Step == step {
			return true
		}
	}
	return false
}

// Check refuses (ErrRefused) to continue a record that is damaged up to
// step, the step of the checkpoint a run resumes from: a complete line
// that is not a JSON record, step records out of order, or a hole — two
// step records (or the start of the run, or the checkpoint) further apart
// than maxGap steps, the largest -log-every the run has had. The error
// names the line and what to do. A last line cut short by a crash is not
// damage (TruncateAfter drops it), nor is anything after step (the resumed
// run writes it again).
func (m *Metrics) Check(step, maxGap int) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		return err
	}
	path := m.f.Name()
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading metrics.jsonl to resume: %w", err)
	}
	fix := fmt.Sprintf("restore %s from a copy, or start the run again with another -out (the checkpoints are intact, but a resumed run would continue a damaged record)", path)
	last, lastLine := 0, 0
	n := 0
	for rest := b; len(rest) > 0; {
		n++
		line := rest
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break // a record cut short by a crash: TruncateAfter drops it
		}
		line, rest = rest[:i], rest[i+1:]
		var rec struct {
			Type string `json:"type"`
			Step *int   `json:"step"`
		}
		if err := json.Unmarshal(line, &rec); err != nil || rec.Type == "" || rec.Step == nil {
			what := "is not a record (no type or step)"
			if err != nil {
				what = fmt.Sprintf("does not parse (%v)", err)
			}
			return refuse("-resume: %s line %d %s: %s", path, n, what, fix)
		}
		if rec.Type != "step" || *rec.Step > step {
			continue
		}
		s := *rec.Step
		switch {
		case s <= last:
			return refuse("-resume: %s line %d records step %d after step %d (line %d): the records are out of order; %s", path, n, s, last, lastLine, fix)
		case s-last > maxGap:
			return refuse("-resume: %s line %d records step %d after step %d: the records of steps %d–%d are missing (the run logs every %d steps at most); %s",
				path, n, s, last, last+1, s-1, maxGap, fix)
		}
		last, lastLine = s, n
	}
	if step-last > maxGap {
		return refuse("-resume: %s records steps up to %d only, the checkpoint is at step %d: the records of steps %d–%d are missing (the run logs every %d steps at most); %s",
			path, last, step, last+1, step, maxGap, fix)
	}
	return nil
}

// StepLosses sums the losses of the step records of epoch (1-based) up to
// step upTo in the metrics.jsonl of the run folder dir, and counts them:
// the part of an epoch recorded before the run resumed in it. Lines that
// do not parse and null losses are left out.
func StepLosses(dir string, epoch, upTo int) (sum float64, n int) {
	f, err := os.Open(filepath.Join(dir, MetricsFile))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		var rec struct {
			Type  string   `json:"type"`
			Epoch int      `json:"epoch"`
			Step  int      `json:"step"`
			Loss  *float64 `json:"loss"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Type == "step" && rec.Epoch == epoch && rec.Step <= upTo && rec.Loss != nil {
			sum += *rec.Loss
			n++
		}
	}
	return sum, n
}
