package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// poisonModel corrupts one rank's step: a NaN gradient element of a named
// tensor, a NaN loss, or a changed parameter.
type poisonModel struct {
	models.Model
	at, steps int
	kind      string // "gradient", "loss" or "param"
	tensor    string
}

func (m *poisonModel) TrainStep(ctx context.Context, b models.Batch, p, g device.Buffer) (models.StepResult, error) {
	m.steps++
	r, err := m.Model.TrainStep(ctx, b, p, g)
	if m.steps == m.at {
		switch m.kind {
		case "gradient":
			for _, l := range m.Layout() {
				if l.Name == m.tensor {
					g.Float32s()[l.Offset+3] = float32(math.NaN())
				}
			}
		case "loss":
			r.Loss = math.Inf(1)
		case "param":
			p.Float32s()[7] += 1
		}
	}
	return r, err
}

// poisonDeferred is a poisonModel whose steps the trainer issues without
// a wait for the loss (models.Deferred, as on a GPU): the poisoned loss
// comes from LastStep, which the trainer reads after the step's last wait.
type poisonDeferred struct {
	*poisonModel
	last models.StepResult
}

func (m *poisonDeferred) StartStep(ctx context.Context, b models.Batch, p, g device.Buffer) error {
	var err error
	m.last, err = m.poisonModel.TrainStep(ctx, b, p, g)
	return err
}

func (m *poisonDeferred) LastStep() (models.StepResult, error) { return m.last, nil }

// poisonSecond wraps the second worker built (some rank) in a poisonModel
// (kind "deferred loss": a poisonDeferred of a non-finite loss).
func poisonSecond(kind string, at int, tensor string) Options {
	var n atomic.Int32
	return Options{wrapModel: func(m models.Model) models.Model {
		if n.Add(1) != 2 {
			return m
		}
		if kind == "deferred loss" {
			return &poisonDeferred{poisonModel: &poisonModel{Model: m, at: at, kind: "loss", tensor: tensor}}
		}
		return &poisonModel{Model: m, at: at, kind: kind, tensor: tensor}
	}}
}

// TestNonFiniteStopsNamingTheTensor: a NaN gradient element stops the run
// at its step naming the tensor (layout name) and the last good
// checkpoint, and no checkpoint of the broken state exists; a non-finite
// loss does the same, read at once or, from a model that defers it
// (models.Deferred, as the trainer's GPU steps), after the step's last
// wait and the update.
func TestNonFiniteStopsNamingTheTensor(t *testing.T) {
	for _, tc := range []struct {
		kind, want string
	}{
		{"gradient", `step 5 \(epoch 1\) failed on rank \d: not finite: the gradient is NaN in tensor mlp\.1\.weight \(element 3 of it\); the last checkpoint is \S+step-000000004 \(step 4\); lower -lr or clip gradients \(-clip\), then resume with: train -resume `},
		{"loss", `step 5 \(epoch 1\) failed on rank \d: not finite: the loss is \+Inf; the last checkpoint is \S+step-000000004 \(step 4\)`},
		{"deferred loss", `step 5 \(epoch 1\) failed on rank \d: not finite: the loss is \+Inf; the last checkpoint is \S+step-000000004 \(step 4\)`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := ncfConfig(t, 3, 10)
			c.Sparsifier, c.Density, c.CheckpointEvery = "topk", Set(0.1), 2
			err := Run(context.Background(), c, poisonSecond(tc.kind, 5, "mlp.1.weight"))
			if err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error()) || !errors.Is(err, errNonFinite) {
				t.Fatalf("err %v\nwant %s", err, tc.want)
			}
			if strings.Count(err.Error(), "train:") != 1 {
				t.Fatalf("%q: want one train: prefix", err)
			}
			if got, _ := rundir.Latest(c.Out); filepath.Base(got) != "step-000000004" {
				t.Fatalf("newest checkpoint %s, want the one of step 4", got)
			}
		})
	}
}

// TestNonFiniteBeforeAnyCheckpoint: a NaN before the first checkpoint
// says so and gives advice that works: the same command is refused (its
// -out holds the failed run), so the message says to change the learning
// rate and start again with another -out or after deleting the folder;
// doing the latter trains.
func TestNonFiniteBeforeAnyCheckpoint(t *testing.T) {
	c := ncfConfig(t, 2, 4)
	c.Sparsifier, c.Density = "topk", Set(0.1)
	err := Run(context.Background(), c, poisonSecond("gradient", 2, "mlp.1.weight"))
	want := `step 2 \(epoch 1\) failed on rank \d: not finite: the gradient is NaN in tensor mlp\.1\.weight \(element 3 of it\); no checkpoint was written yet: lower -lr or clip gradients \(-clip\), then start the run again with another -out \(or delete ` + regexp.QuoteMeta(c.Out) + ` first\)$`
	if err == nil || !regexp.MustCompile(want).MatchString(err.Error()) {
		t.Fatalf("err %v\nwant %s", err, want)
	}
	if err := Run(context.Background(), c, Options{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("the same command again: %v, want it refused (so the message must not offer it)", err)
	}
	if err := os.RemoveAll(c.Out); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatalf("after deleting the folder, as the message says: %v", err)
	}
}

// TestCheckEveryNamesTheDivergedRank: parameters that differ between ranks
// stop the run at the next -check-every step, naming the rank; without
// -check-every the next checkpoint catches them and is not written.
func TestCheckEveryNamesTheDivergedRank(t *testing.T) {
	// Simulated workers share one parameter vector, which cannot diverge:
	// the replicas here are separate runs over one in-process
	// communicator, each with its own parameters, as under mpirun.
	replicas := func(c Config, o Options) error {
		return local.Run(context.Background(), c.Workers.Value(), func(ctx context.Context, cm comm.Communicator) error {
			oo := o
			oo.Comm = cm
			return Run(ctx, c, oo)
		})
	}
	c := ncfConfig(t, 3, 12)
	c.CheckEvery = 3
	err := replicas(c, poisonSecond("param", 4, ""))
	if !errors.Is(err, ErrDiverged) || !regexp.MustCompile(`parameters differ after step 6: rank (\d) differs from ranks (\d), (\d) `).MatchString(err.Error()) {
		t.Fatalf("err %v", err)
	}
	c = ncfConfig(t, 3, 12)
	c.CheckpointEvery = 5
	err = replicas(c, poisonSecond("param", 7, ""))
	if !errors.Is(err, ErrDiverged) || !strings.Contains(err.Error(), "after step 10") || !strings.Contains(err.Error(), "step-000000005 (step 5)") {
		t.Fatalf("err %v", err)
	}
	if got, _ := rundir.Latest(c.Out); filepath.Base(got) != "step-000000005" {
		t.Fatalf("newest checkpoint %s: a checkpoint of diverged parameters was written", got)
	}
}

// TestDivergedNamesTheOddRanks: the ranks named are those whose
// parameters differ from the most common ones (rank 0's group on a tie),
// so that one bad rank 0 is named as such rather than every other rank.
func TestDivergedNamesTheOddRanks(t *testing.T) {
	for _, tc := range []struct {
		hashes []int64
		want   string // "" when none differ
	}{
		{[]int64{7}, ""},
		{[]int64{7, 7, 7}, ""},
		{[]int64{7, 8}, "rank 1 differs from rank 0"},
		{[]int64{7, 8, 8}, "rank 0 differs from ranks 1, 2"},
		{[]int64{7, 7, 8}, "rank 2 differs from ranks 0, 1"},
		{[]int64{7, 8, 9}, "ranks 1, 2 differ from rank 0"},
		{[]int64{7, 7, 8, 8, 9}, "ranks 2, 3, 4 differ from ranks 0, 1"},
		{[]int64{5, 5, 5, 9, 5}, "rank 3 differs from ranks 0, 1, 2, 4"},
		{[]int64{9, 5, 5, 5, 5}, "rank 0 differs from ranks 1, 2, 3, 4"},
	} {
		err := diverged(tc.hashes, 6)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v, want none", tc.hashes, err)
			}
			continue
		}
		want := "the workers' parameters differ after step 6: " + tc.want + " (a nondeterministic reduction, a bug or a hardware fault)"
		if err == nil || !errors.Is(err, ErrDiverged) || err.Error() != want {
			t.Errorf("%v: %v\nwant %s", tc.hashes, err, want)
		}
	}
}

// TestCheckpointWriteFailureStopsTheRun: a checkpoint that one rank
// cannot write (here rank 1's part, by the test's hook; a full disk is
// TestFullDiskStopsTheRun) or whose folder cannot be made stops the run
// with an error that says what was lost and how to go on; the failed
// checkpoint leaves no folder, the previous one stays the newest, and the
// resume the message names completes the run.
func TestCheckpointWriteFailureStopsTheRun(t *testing.T) {
	t.Run("rank 1 cannot write", func(t *testing.T) {
		c := ncfConfig(t, 2, 9)
		c.CheckpointEvery = 2
		defer func() { ckptWriteHook = nil }()
		ckptWriteHook = func(path string) error {
			if strings.Contains(path, "step-000000004") && strings.HasSuffix(path, rundir.ShardFile(1)) {
				return &os.PathError{Op: "write", Path: path, Err: syscall.ENOSPC}
			}
			return nil
		}
		err := Run(context.Background(), c, Options{})
		want := "train: stopped after step 4: its checkpoint was not written: rank 1: write " + filepath.Join(rundir.CheckpointDir(c.Out, 4), rundir.ShardFile(1)) +
			": no space left on device; steps 3 to 4 are lost; the last checkpoint is " + rundir.CheckpointDir(c.Out, 2) + " (step 2); make room on the disk (or fix the folder), then resume with: train -resume " + c.Out
		if err == nil || err.Error() != want {
			t.Fatalf("err\n%v\nwant\n%s", err, want)
		}
		if _, err := os.Stat(rundir.CheckpointDir(c.Out, 4)); err == nil {
			t.Error("the failed checkpoint's folder was left")
		}
		if got, _ := rundir.Latest(c.Out); got != rundir.CheckpointDir(c.Out, 2) {
			t.Fatalf("newest checkpoint %s, want step 2's", got)
		}
		ckptWriteHook = nil
		if err := Run(context.Background(), Config{Resume: c.Out}, Options{}); err != nil {
			t.Fatal(err)
		}
		if got, _ := rundir.Latest(c.Out); got != rundir.CheckpointDir(c.Out, 9) {
			t.Fatalf("after the resume the newest checkpoint is %s, want step 9's", got)
		}
	})
	t.Run("no folder for step 6", func(t *testing.T) {
		c := ncfConfig(t, 2, 9)
		c.CheckpointEvery = 2
		// A file where step 6's folder goes: it cannot be created.
		os.MkdirAll(filepath.Join(c.Out, "checkpoints"), 0o755)
		os.WriteFile(rundir.CheckpointDir(c.Out, 6), []byte("in the way"), 0o644)
		err := Run(context.Background(), c, Options{})
		if err == nil || !strings.Contains(err.Error(), "stopped after step 6: its checkpoint was not written:") ||
			!strings.Contains(err.Error(), "not a directory; steps 5 to 6 are lost; the last checkpoint is "+rundir.CheckpointDir(c.Out, 4)+" (step 4)") {
			t.Fatalf("err %v", err)
		}
	})
}

// TestInterruptWithUnwritableCheckpoint: when the checkpoint of an
// interruption cannot be written, the run says so and points at the
// previous one.
func TestInterruptWithUnwritableCheckpoint(t *testing.T) {
	c := ncfConfig(t, 2, 20)
	c.CheckpointEvery = 3
	defer func() { ckptWriteHook = nil }()
	ckptWriteHook = func(path string) error {
		if strings.Contains(path, "step-000000005") {
			return &os.PathError{Op: "write", Path: path, Err: syscall.ENOSPC}
		}
		return nil
	}
	err := Run(context.Background(), c, stopAt(5))
	want := "interrupted after step 5, but the checkpoint of step 5 not written: "
	if !errors.Is(err, ErrInterrupted) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "the previous checkpoint "+rundir.CheckpointDir(c.Out, 3)+" is intact; resume with: train -resume "+c.Out) {
		t.Fatalf("err %v", err)
	}
}

// TestBadCheckpointsAreRefused: a damaged shared part, a damaged or
// foreign rank's part, and a checkpoint of another worker count are
// refused saying what is wrong, and nothing is trained; a newer incomplete
// checkpoint is passed over for the newest complete one, which the resume
// names.
func TestBadCheckpointsAreRefused(t *testing.T) {
	c := ncfConfig(t, 2, 6)
	c.CheckpointEvery = 2
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	copyRun := func() string {
		d := t.TempDir()
		if err := os.CopyFS(d, os.DirFS(c.Out)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	resume := func(d string, o Options) error {
		return Run(context.Background(), Config{Resume: d, Steps: 8}, o)
	}
	flip := func(p string, at int) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if at < 0 {
			at += len(b)
		}
		b[at] ^= 0x10
		os.WriteFile(p, b, 0o644)
	}
	for _, tc := range []struct {
		name   string
		damage func(d string)
		want   string
	}{
		{"shared bit flip", func(d string) { flip(filepath.Join(rundir.CheckpointDir(d, 6), rundir.SharedFile), -5) }, "shared.ckpt is not a valid checkpoint file: checksum mismatch"},
		{"shared truncated", func(d string) { os.Truncate(filepath.Join(rundir.CheckpointDir(d, 6), rundir.SharedFile), 100) }, "shared.ckpt is not a valid checkpoint file"},
		{"rank part bit flip", func(d string) { flip(filepath.Join(rundir.CheckpointDir(d, 6), rundir.ShardFile(1)), -9) }, filepath.Join("step-000000006", rundir.ShardFile(1)) + " is not the part the checkpoint lists"},
		{"rank part of another checkpoint", func(d string) {
			b, _ := os.ReadFile(filepath.Join(rundir.CheckpointDir(d, 4), rundir.ShardFile(0)))
			os.WriteFile(filepath.Join(rundir.CheckpointDir(d, 6), rundir.ShardFile(0)), b, 0o644)
		}, "is not the part the checkpoint lists"},
		{"rank part missing", func(d string) { os.Remove(filepath.Join(rundir.CheckpointDir(d, 6), rundir.ShardFile(1))) }, "rank 1: reading this rank's part"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := copyRun()
			tc.damage(d)
			before, _ := os.ReadFile(filepath.Join(d, "metrics.jsonl"))
			err := resume(d, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if after, _ := os.ReadFile(filepath.Join(d, "metrics.jsonl")); !bytes.Equal(before, after) {
				t.Fatal("a refused resume changed metrics.jsonl")
			}
			// The message says which checkpoint to move away and which one
			// the resume then takes; doing so resumes from it.
			hint := "move " + rundir.CheckpointDir(d, 6) + " away to resume from the one before it, " + rundir.CheckpointDir(d, 4) + " (step 4)"
			if !strings.Contains(err.Error(), hint) {
				t.Fatalf("err %v\nlacks %q", err, hint)
			}
			if err := os.Rename(rundir.CheckpointDir(d, 6), filepath.Join(t.TempDir(), "damaged")); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			o := Options{Stdout: &out, Progress: &out, Given: map[string]bool{"resume": true, "steps": true, "quiet": true}}
			if err := Run(context.Background(), Config{Resume: d, Steps: 8, Quiet: false}, o); err != nil {
				t.Fatalf("resume after moving the damaged checkpoint away: %v", err)
			}
			if !strings.Contains(out.String(), "resuming from "+rundir.CheckpointDir(d, 4)+" (step 4, epoch 1)") {
				t.Fatalf("output:\n%s", out.String())
			}
		})
	}
	t.Run("no earlier checkpoint", func(t *testing.T) {
		d := copyRun()
		os.RemoveAll(rundir.CheckpointDir(d, 4))
		flip(filepath.Join(rundir.CheckpointDir(d, 6), rundir.SharedFile), -5)
		err := resume(d, Options{})
		want := "checksum mismatch (the file is corrupted or truncated); there is no earlier complete checkpoint: start the run again with another -out"
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Fatalf("err %v\nwant %q", err, want)
		}
	})
	t.Run("no checkpoint", func(t *testing.T) {
		d := copyRun()
		os.RemoveAll(filepath.Join(d, "checkpoints"))
		if err := resume(d, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no complete checkpoint") {
			t.Fatalf("err %v", err)
		}
		os.MkdirAll(filepath.Join(d, "checkpoints"), 0o755)
		os.WriteFile(filepath.Join(d, "checkpoints", "step-000000006.ckpt"), []byte("SGCKPT01"), 0o644)
		if err := resume(d, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "older version") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("newest incomplete", func(t *testing.T) {
		d := copyRun()
		os.MkdirAll(rundir.CheckpointDir(d, 7), 0o755)
		os.WriteFile(filepath.Join(rundir.CheckpointDir(d, 7), rundir.ShardFile(0)), []byte("partial"), 0o644)
		var out bytes.Buffer
		// -quiet=false given on the command line overrides the run's -quiet.
		o := Options{Stdout: &out, Progress: &out, Given: map[string]bool{"resume": true, "steps": true, "quiet": true}}
		if err := Run(context.Background(), Config{Resume: d, Steps: 8, Quiet: false}, o); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "resuming from "+rundir.CheckpointDir(d, 6)+" (step 6, epoch 1)") {
			t.Fatalf("output:\n%s", out.String())
		}
		if _, err := os.Stat(rundir.CheckpointDir(d, 7)); err == nil {
			t.Fatal("the incomplete checkpoint's folder is left")
		}
	})
	t.Run("other worker count", func(t *testing.T) {
		d := copyRun()
		// The run's record says 3 workers: the checkpoint's 2 differ.
		b, _ := os.ReadFile(filepath.Join(d, "run.json"))
		var info map[string]any
		json.Unmarshal(b, &info)
		info["workers"] = 3
		b, _ = json.Marshal(info)
		os.WriteFile(filepath.Join(d, "run.json"), b, 0o644)
		err := resume(d, Options{})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "workers: the checkpoint has 2, this run 3") {
			t.Fatalf("err %v", err)
		}
	})
}

// TestRunInUseIsRefused: a run directory another process is training in
// (its lock held) cannot be resumed or written into.
func TestRunInUseIsRefused(t *testing.T) {
	c := ncfConfig(t, 2, 2)
	if err := Run(context.Background(), c, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.Out, ".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a finished run left its lock file .lock (stat: %v)", err)
	}
	unlock, err := rundir.Lock(c.Out)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl"))
	err = Run(context.Background(), Config{Resume: c.Out, Steps: 4}, Options{})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), fmt.Sprintf("is in use by another train process (pid %d)", os.Getpid())) {
		t.Fatalf("err %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(c.Out, "metrics.jsonl")); !bytes.Equal(before, after) {
		t.Fatal("the refused resume changed metrics.jsonl")
	}
	unlock()
	if err := Run(context.Background(), Config{Resume: c.Out, Steps: 4}, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.Out, ".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a finished resume left its lock file .lock (stat: %v)", err)
	}
}
