package train

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is rank 0's console output: a progress bar per epoch with the
// loss and samples/s when bars go to a terminal, and one line per epoch and
// evaluation otherwise.
type progress struct {
	barOut  io.Writer
	out     io.Writer
	term    bool
	bar     *progressbar.ProgressBar
	epoch   int
	epochs  int
	samples int
	start   time.Time
	loss    float64
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(barOut, out io.Writer) *progress {
	return &progress{barOut: barOut, out: out, term: isTerminal(barOut)}
}

func (p *progress) startEpoch(epoch, epochs, steps int) {
	p.epoch, p.epochs, p.samples, p.start = epoch, epochs, 0, time.Now()
	if p.term {
		p.bar = progressbar.NewOptions(steps,
			progressbar.OptionSetWriter(p.barOut),
			progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch, epochs)),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionClearOnFinish(),
		)
	}
}

func (p *progress) add(samples int, loss float64) {
	p.samples += samples
	p.loss = loss
	if p.bar != nil {
		rate := float64(p.samples) / time.Since(p.start).Seconds()
		p.bar.Describe(fmt.Sprintf("epoch %d/%d loss %.4f %.0f samples/s", p.epoch, p.epochs, loss, rate))
		p.bar.Add(1)
	}
}

func (p *progress) endEpoch() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
	d := time.Since(p.start)
	fmt.Fprintf(p.out, "epoch %d/%d: loss %.4f, %.0f samples/s, %v\n", p.epoch, p.epochs, p.loss, float64(p.samples)/d.Seconds(), d.Round(time.Millisecond))
}

func (p *progress) eval(epoch, step int, ms []metric) {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s %.4f", m.Name, m.Value))
	}
	fmt.Fprintf(p.out, "eval epoch %d step %d: %s\n", epoch, step, strings.Join(parts, ", "))
}
