package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/sparsegrad/sparsegrad/metrics"
)

// The records of metrics.jsonl are declared once, in package metrics, which
// package reports reads with; these aliases keep their train names.
type (
	// Num is metrics.Num: a float64 written as null when NaN or infinite.
	Num = metrics.Num
	// StepRecord is metrics.Step, a line with "type":"step".
	StepRecord = metrics.Step
	// OpCount is metrics.OpCount, one operation's traffic in a step record.
	OpCount = metrics.OpCount
	// EvalRecord is metrics.Eval, a line with "type":"eval".
	EvalRecord = metrics.Eval
)

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
