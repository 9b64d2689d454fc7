package rundir

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// writeCheckpoint writes a complete checkpoint of two ranks at step
// (complete: with its shared part).
func writeCheckpoint(t *testing.T, run string, step int, complete bool) *Checkpoint[sampleConfig] {
	t.Helper()
	ck, sh := sampleCheckpoint()
	ck.Step, ck.Shards = step, make([]ShardInfo, 2)
	for r := range 2 {
		s := *sh
		s.Rank, s.Step = r, step
		info, err := WriteShard(run, &s)
		if err != nil {
			t.Fatal(err)
		}
		ck.Shards[r] = info
	}
	if complete {
		if err := WriteShared(run, ck); err != nil {
			t.Fatal(err)
		}
	}
	return ck
}

// TestCheckpointFolder: checkpoints written part by part read back
// through Latest and ReadLatest; a part of another rank or checkpoint is
// refused; Prune keeps the newest two, RemoveAfter removes newer
// incomplete ones, and FallBack names the one before a bad one.
func TestCheckpointFolder(t *testing.T) {
	run := t.TempDir()
	if err := Create(run); err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{2, 4, 6} {
		writeCheckpoint(t, run, s, true)
	}
	writeCheckpoint(t, run, 8, false)
	dir, raw, ck, err := ReadLatest[sampleConfig](run)
	if err != nil || dir != CheckpointDir(run, 6) || ck.Step != 6 || len(raw) == 0 {
		t.Fatalf("ReadLatest: %s, step %v, %v", dir, ck, err)
	}
	sh, err := ck.ReadShard(dir, 1)
	if err != nil || sh.Rank != 1 || sh.Step != 6 || string(sh.Reducer) != "state" {
		t.Fatalf("ReadShard: %+v, %v", sh, err)
	}
	// Rank 0's part where rank 1's should be: not the part listed.
	b, _ := os.ReadFile(filepath.Join(dir, ShardFile(0)))
	os.WriteFile(filepath.Join(dir, ShardFile(1)), b, 0o644)
	if _, err := ck.ReadShard(dir, 1); err == nil || !strings.Contains(err.Error(), "is not the part the checkpoint lists") {
		t.Errorf("a foreign part: %v", err)
	}
	if got, want := FallBack(run, dir), "move "+dir+" away to resume from the one before it, "+CheckpointDir(run, 4)+" (step 4)"; got != want {
		t.Errorf("FallBack = %q, want %q", got, want)
	}
	for _, rank := range []int{1, 0} {
		Prune(run, rank, 4, quiet)
		RemoveAfter(run, 6, rank, quiet)
	}
	if steps, err := checkpointSteps(run); err != nil || !slices.Equal(steps, []int{6, 4}) {
		t.Fatalf("after Prune and RemoveAfter: steps %v, %v", steps, err)
	}
	if got := FallBack(run, CheckpointDir(run, 4)); !strings.Contains(got, "there is no earlier complete checkpoint") {
		t.Errorf("FallBack of the oldest = %q", got)
	}
	RemoveShard(run, 4, 0)
	RemoveShard(run, 4, 1)
	if _, err := os.Stat(filepath.Join(CheckpointDir(run, 4), SharedFile)); err != nil {
		t.Errorf("RemoveShard removed a complete checkpoint's shared part: %v", err)
	}
}

// TestReadLatestRefusals: a run without a complete checkpoint, with only
// an older version's, or whose newest is damaged is refused saying what
// to do.
func TestReadLatestRefusals(t *testing.T) {
	run := t.TempDir()
	writeCheckpoint(t, run, 3, false)
	for _, c := range []struct {
		edit func()
		want string
	}{
		{func() {}, "the run has no complete checkpoint to continue from"},
		{func() { os.WriteFile(filepath.Join(run, checkpointsDir, "step-000000001.ckpt"), nil, 0o644) }, "(step-000000001.ckpt, ...) are of an older version"},
		{func() {
			writeCheckpoint(t, run, 5, true)
			os.Truncate(filepath.Join(CheckpointDir(run, 5), SharedFile), 40)
		}, "shared.ckpt is not a valid checkpoint file: truncated header"},
	} {
		c.edit()
		_, _, _, err := ReadLatest[sampleConfig](run)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err %v, want a refusal saying %q", err, c.want)
		}
	}
}

// TestTruncateAfter: the records after the checkpoint's step go, and so do
// the evaluation at it when it is due again and a record cut short; the
// rest stays, and writing goes on at the end.
func TestTruncateAfter(t *testing.T) {
	dir := t.TempDir()
	lines := []string{
		`{"type":"step","step":1,"wall":1}`,
		`not json, but whole`,
		`{"type":"step","step":2,"wall":2}`,
		`{"type":"eval","step":2,"wall":2.5}`,
		`{"type":"note","step":9}`,
		`{"type":"step","step":3,"wall":3}`,
		`{"type":"eval","step":3,"wall":3.5}`,
	}
	for _, c := range []struct {
		evalDue   bool
		kept      []int
		maxWall   float64
		evaluated bool
	}{
		{false, []int{0, 1, 2, 3, 4}, 2.5, true},
		{true, []int{0, 1, 2, 4}, 2, false},
	} {
		if err := os.WriteFile(filepath.Join(dir, MetricsFile), []byte(strings.Join(lines, "\n")+"\n"+`{"type":"step","st`), 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := OpenMetrics(dir, true)
		if err != nil {
			t.Fatal(err)
		}
		maxWall, evaluated, dropped, err := m.TruncateAfter(2, c.evalDue)
		if err != nil || maxWall != c.maxWall || evaluated != c.evaluated || dropped != len(lines)+1-len(c.kept) {
			t.Errorf("evalDue %v: wall %v, evaluated %v, dropped %d, %v", c.evalDue, maxWall, evaluated, dropped, err)
		}
		if err := m.Write(map[string]any{"type": "step", "step": 3}); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, i := range c.kept {
			want = append(want, lines[i])
		}
		want = append(want, `{"step":3,"type":"step"}`)
		if b, _ := os.ReadFile(filepath.Join(dir, MetricsFile)); string(b) != strings.Join(want, "\n")+"\n" {
			t.Errorf("evalDue %v: metrics.jsonl\n%s\nwant\n%s", c.evalDue, b, strings.Join(want, "\n"))
		}
		if EvaluatedAt(dir, 2) != c.evaluated {
			t.Errorf("evalDue %v: EvaluatedAt(2) = %v", c.evalDue, !c.evaluated)
		}
	}
}

// TestFolderFiles: a folder with a run is refused for a new one and read
// back; a missing folder or one without run.json is refused for a resume;
// Discard removes what a failed new run wrote and nothing else; a log
// reaches its file only once kept.
func TestFolderFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := CheckFresh(dir); err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	if err := ReadRun(dir, &info); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no such folder") {
		t.Errorf("ReadRun of a missing folder: %v", err)
	}
	if err := Create(dir); err != nil {
		t.Fatal(err)
	}
	if err := ReadRun(dir, &info); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no run.json there") {
		t.Errorf("ReadRun of a folder without run.json: %v", err)
	}
	if err := WriteRun(dir, map[string]int{"workers": 3}); err != nil {
		t.Fatal(err)
	}
	if err := ReadRun(dir, &info); err != nil || info["workers"] != 3.0 {
		t.Errorf("ReadRun: %v, %v", info, err)
	}
	if err := CheckFresh(dir); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already holds a run") {
		t.Errorf("CheckFresh of a run: %v", err)
	}
	l, lg := NewLog(dir, 1)
	lg.Info("before")
	if _, err := os.Stat(LogPath(dir, 1)); err == nil {
		t.Error("a log written before it was kept")
	}
	if err := l.Keep(); err != nil {
		t.Fatal(err)
	}
	lg.Info("after")
	l.Close()
	if b, _ := os.ReadFile(LogPath(dir, 1)); !strings.Contains(string(b), "before") || !strings.Contains(string(b), "after") {
		t.Errorf("log %q", b)
	}
	os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644)
	Discard(dir, true, true)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 || ents[0].Name() != "logs" || ents[1].Name() != "notes.txt" {
		t.Errorf("left after Discard: %v", ents)
	}
}

// TestCheckFreshRefusesOtherFolders: a folder of other files is no place
// for a new run; a missing or empty one is, and so is one holding only
// what a failed run or a sweep's marker left.
func TestCheckFreshRefusesOtherFolders(t *testing.T) {
	root := t.TempDir()
	if err := CheckFresh(filepath.Join(root, "missing")); err != nil {
		t.Errorf("a missing folder: %v", err)
	}
	if err := CheckFresh(root); err != nil {
		t.Errorf("an empty folder: %v", err)
	}
	for _, n := range []string{"sweep-started.json", MetricsFile, checkpointsDir, logsDir} {
		if err := os.Mkdir(filepath.Join(root, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckFresh(root); err != nil {
		t.Errorf("a folder of a failed run and a sweep marker: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "thesis.tex"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := CheckFresh(root)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "thesis.tex") || !strings.Contains(err.Error(), "new or empty folder") {
		t.Errorf("a folder of other files: %v", err)
	}
}
