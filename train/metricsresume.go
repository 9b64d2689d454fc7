package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// sync makes the metrics written so far durable (rank 0; nothing on other
// ranks).
func (o *output) sync() error {
	if o == nil || o.metrics == nil {
		return nil
	}
	m := o.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		return err
	}
	return m.f.Sync()
}

// truncateAfter makes metrics.jsonl the record of a run that continues
// after step: the step records after it and the evaluations after it go
// (a run that died after its last checkpoint wrote them, and the resumed
// run writes them again), and so do the evaluations at step when
// evalDue says the resumed run redoes it. Other lines stay, and so does an
// unparsable line other than an unterminated last one (a record cut by a
// crash). It returns the largest wall time kept and whether an evaluation
// at step was kept. The file is replaced atomically.
func (o *output) truncateAfter(step int, evalDue bool) (maxWall float64, evaluated bool, err error) {
	if o == nil || o.metrics == nil {
		return 0, false, nil
	}
	m := o.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.w.Flush(); err != nil {
		return 0, false, err
	}
	path := m.f.Name()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, fmt.Errorf("reading metrics.jsonl to resume: %w", err)
	}
	var kept bytes.Buffer
	dropped := 0
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
		return maxWall, evaluated, nil
	}
	if err := writeFileAtomic(path, kept.Bytes()); err != nil {
		return 0, false, fmt.Errorf("rewriting metrics.jsonl to resume: %w", err)
	}
	o.log.Info("metrics.jsonl: records after the checkpoint removed", "records", dropped, "step", step)
	m.f.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, false, fmt.Errorf("train: opening metrics: %w", err)
	}
	m.f = f
	m.w.Reset(f)
	return maxWall, evaluated, nil
}
