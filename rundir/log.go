package rundir

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// LogPath is the file of rank's log in the run folder dir.
func LogPath(dir string, rank int) string {
	return filepath.Join(dir, logsDir, fmt.Sprintf("rank-%d.log", rank))
}

// Log is a rank's log, logs/rank-N.log. Until Keep is called it holds the
// lines in memory: a run that fails before its first step, or a resume
// that is refused, leaves no log behind (nothing in the run's folder
// changes); Keep writes them and every later line to the file.
type Log struct {
	mu   sync.Mutex
	path string
	buf  []byte
	f    *os.File
	err  error // of opening the file
}

// NewLog returns the log of rank in the run folder dir, in memory until
// kept, and a logger that writes to it.
func NewLog(dir string, rank int) (*Log, *slog.Logger) {
	l := &Log{path: LogPath(dir, rank)}
	return l, slog.New(slog.NewTextHandler(l, nil)).With("rank", rank)
}

func (l *Log) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		if l.err == nil {
			l.buf = append(l.buf, b...)
		}
		return len(b), nil
	}
	return l.f.Write(b)
}

// Keep writes the lines so far to the file and the later ones as they
// come; an error is returned once (the lines are then dropped).
func (l *Log) Keep() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil || l.err != nil {
		return nil
	}
	if l.err = os.MkdirAll(filepath.Dir(l.path), 0o755); l.err == nil {
		l.f, l.err = os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	}
	if l.err == nil {
		_, l.err = l.f.Write(l.buf)
	}
	l.buf = nil
	if l.err != nil {
		return fmt.Errorf("writing the log of the run: %w", l.err)
	}
	return nil
}

// Close closes the file (lines not kept are dropped).
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = nil
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
