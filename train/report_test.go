package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReportOffCriticalPath: a report that takes long (npm fetching
// ECharts) does not hold training up: the second epoch trains while the
// first epoch's report is still being written; the reports never overlap;
// the last one, written when training has ended, sees every record.
func TestReportOffCriticalPath(t *testing.T) {
	c := ncfConfig(t, 2, 0)
	c.Epochs, c.Batch = Set(2), Set(1<<14)
	release := make(chan struct{})
	var mu sync.Mutex
	var calls, inFlight, overlaps int
	var lastSaw string
	var finalStep atomic.Int64
	report := func(dir string) error {
		mu.Lock()
		calls++
		first := calls == 1
		inFlight++
		if inFlight > 1 {
			overlaps++
		}
		mu.Unlock()
		if first {
			select { // the synchronous writer of old would wait here forever
			case <-release:
			case <-time.After(90 * time.Second):
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
		mu.Lock()
		lastSaw = string(b)
		inFlight--
		mu.Unlock()
		return err
	}
	errc := make(chan error, 1)
	go func() {
		errc <- Run(context.Background(), c, Options{Report: report, LossSink: func(step int, _ float64) { finalStep.Store(int64(step)) }})
	}()
	// Training reaches the last epoch's evaluation while the first report
	// is blocked.
	deadline := time.After(60 * time.Second)
	for done := false; !done; {
		select {
		case <-deadline:
			t.Fatalf("training stalled at step %d behind the first epoch's report", finalStep.Load())
		case <-time.After(10 * time.Millisecond):
			b, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl"))
			done = strings.Count(string(b), `"metric":"hr10"`) == 2
		}
	}
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if overlaps > 0 {
		t.Fatalf("%d reports were written while another was", overlaps)
	}
	if calls < 2 || calls > 3 {
		t.Fatalf("%d reports for 2 epochs, want the blocked one, perhaps the second epoch's, and the final one", calls)
	}
	if strings.Count(lastSaw, `"metric":"hr10"`) != 2 || !strings.Contains(lastSaw, fmt.Sprintf(`"step":%d,`, finalStep.Load())) {
		t.Fatalf("the final report saw:\n%s", lastSaw)
	}
}

// TestReporter: refreshes never block and never overlap, the refreshes
// asked for while one is written coalesce into at most one more (which
// finish drops when it has not started: the final report supersedes it),
// finish writes the final report after the last refresh has ended, and
// errors go to warn.
func TestReporter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		refreshes int
		final     bool
		fail      bool
		// wantMin and wantMax bound the writes.
		wantMin, wantMax int
	}{
		{"no refresh, final", 0, true, false, 1, 1},
		{"no refresh, no final", 0, false, false, 0, 0},
		{"one refresh, final", 1, true, false, 2, 2},
		{"many refreshes coalesce", 50, true, false, 2, 3},
		{"many refreshes, no final", 50, false, false, 1, 2},
		{"errors are warnings", 3, true, true, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var writes, inFlight, overlaps, warnings int
			gate := make(chan struct{})
			r := newReporter(func() error {
				mu.Lock()
				writes++
				first := writes == 1
				inFlight++
				overlaps += max(inFlight-1, 0)
				mu.Unlock()
				if first && tc.refreshes > 0 {
					<-gate // the first refresh is slow
				}
				mu.Lock()
				inFlight--
				mu.Unlock()
				if tc.fail {
					return errors.New("no ECharts")
				}
				return nil
			}, func(err error) {
				mu.Lock()
				warnings++
				mu.Unlock()
			})
			if tc.refreshes > 0 {
				r.refresh()
				for started := false; !started; { // the first write is in progress, held by gate
					time.Sleep(time.Millisecond)
					mu.Lock()
					started = writes == 1
					mu.Unlock()
				}
				start := time.Now()
				for range tc.refreshes - 1 {
					r.refresh()
				}
				if d := time.Since(start); d > time.Second {
					t.Fatalf("refresh blocked for %v while a report was written", d)
				}
			}
			close(gate)
			r.finish(tc.final)
			mu.Lock()
			defer mu.Unlock()
			if writes < tc.wantMin || writes > tc.wantMax || overlaps != 0 {
				t.Fatalf("%d writes (want %d..%d), %d overlapping", writes, tc.wantMin, tc.wantMax, overlaps)
			}
			if tc.fail && warnings != writes || !tc.fail && warnings != 0 {
				t.Fatalf("%d warnings for %d writes", warnings, writes)
			}
		})
	}
	// A nil reporter (ranks other than 0, no Options.Report) does nothing.
	var r *reporter
	r.refresh()
	r.finish(true)
}
