package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestRunTooLargeForMemoryIsRefused: an LSTM batch of a million sequences
// fits the data (each sequence keeps two tokens) but needs terabytes, which
// no machine has available: the run is refused before anything is
// allocated or written, naming what it needs, what the machine has and
// the batch that fits; that batch passes the check, twice it does not.
func TestRunTooLargeForMemoryIsRefused(t *testing.T) {
	if _, _, ok := machineMemory(); !ok {
		t.Skip("the machine's memory cannot be read here (not Linux)")
	}
	c := Config{Model: "lstm", DataDir: testenv.SharedData(t, "wikitext-2"), Batch: Set(1_000_000), Out: filepath.Join(t.TempDir(), "run"), Quiet: true}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := Run(context.Background(), c, Options{})
	runtime.ReadMemStats(&after)
	m := regexp.MustCompile(`^train: invalid configuration: the run needs at least ([0-9,.]+ [MGT]B) of memory \(lstm's training program at -batch 1,000,000: [0-9,.]+ [MGT]B(; .*)?\), and this machine has [0-9,.]+ [MG]B available \(of [0-9,.]+ [MG]B\); lower -batch \(-batch ([0-9,]+) would fit\)$`).FindStringSubmatch(errString(err))
	if !errors.Is(err, ErrConfig) || m == nil {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(c.Out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused run made its folder (stat: %v)", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<30 {
		t.Errorf("the refused run allocated %d MB", d>>20)
	}
	fits, _ := strconv.Atoi(strings.ReplaceAll(m[3], ",", ""))
	if fits < 1 || fits >= 1_000_000 {
		t.Fatalf("-batch %d would fit: want between 1 and the batch refused", fits)
	}
	check := func(batch int) error {
		cc := c
		cc.Batch = Set(batch)
		cc = cc.Defaults()
		ds, err := LoadDataset(context.Background(), cc)
		if err != nil {
			t.Fatal(err)
		}
		return checkFits(cc, ds, 1, 1, 1, nil)
	}
	// The memory available moves with the machine's other processes.
	if err := check(fits * 9 / 10); err != nil {
		t.Errorf("nine tenths of the batch the message offers, %d, is refused: %v", fits, err)
	}
	if err := check(2 * fits); err == nil {
		t.Errorf("twice the batch the message offers, %d, passes the check", 2*fits)
	}
}

// TestFitsRefusesWhatCannotWork: a batch larger than a worker's share of
// the training data and a density below one gradient element are refused
// before anything is built, with the bound; the bound itself passes.
func TestFitsRefusesWhatCannotWork(t *testing.T) {
	c := ncfConfig(t, 1, 2)
	c = c.Defaults()
	ds, err := LoadDataset(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	samples := len(ds.Rec.TrainUser) * (1 + ncfNegatives) // ml-100k: 99,057 training positives, 4 negatives each
	for _, tc := range []struct {
		workers, batch int
		density        float64
		want           string // "" passes
	}{
		{1, samples, 0.01, ""},
		{1, samples + 1, 0.01, "-batch 495,286: the worker gets 495,285 training samples per epoch, fewer than one batch; lower -batch (at most 495,285)"},
		{3, samples/3 + 1, 0.01, "-batch 165,096: each of 3 workers gets 165,095 training samples per epoch, fewer than one batch; lower -batch (at most 165,095) or -workers"},
		{3, samples / 3, 0.01, ""},
		{1, 256, 1e-300, "-density 1e-300 selects 1.08e-295 of the 107,761 gradient elements of ncf, less than one; the smallest density is 1/107,761 = 9.28e-06 (k = 1)"},
		{1, 256, 1.0 / 107761, ""},
		{5, 256, 0.5 / 107761, "less than one"},
	} {
		cc := c
		cc.Batch, cc.Density, cc.Sparsifier = Set(tc.batch), Set(tc.density), "topk"
		err := checkFits(cc, ds, tc.workers, 1, tc.workers, simulated(cc, "local", tc.workers))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%d workers, batch %d, density %g: %v", tc.workers, tc.batch, tc.density, err)
		case tc.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%d workers, batch %d, density %g: %v\nwant %q", tc.workers, tc.batch, tc.density, err, tc.want)
		}
	}
	// Dense sends everything: no density applies.
	cc := c
	cc.Density, cc.Sparsifier = Set(1e-300), "dense"
	if err := checkFits(cc, ds, 1, 1, 1, nil); err != nil {
		t.Errorf("dense with -density 1e-300: %v", err)
	}
}
