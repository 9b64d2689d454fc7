// Package rundir owns a training run's folder on disk (the train command's
// -out): which files it holds, their formats, and how each is written and
// read, so that a run stopped at any point (killed, out of disk space,
// interrupted) is continued exactly or refused with what to do. The
// folder holds
//
//   - run.json: the run's description (metrics.Run), replaced atomically
//     (WriteRun, ReadRun);
//   - metrics.jsonl: one JSON record per line (metrics.Step, metrics.Eval),
//     appended and flushed one at a time, cut back to a checkpoint when the
//     run resumes (Metrics);
//   - checkpoints/step-NNNNNNNNN/: the checkpoints, each rank's part and
//     rank 0's shared part that completes it (Checkpoint, Shard; written by
//     WriteShard and WriteShared, found by Latest, read by ReadLatest and
//     Checkpoint.ReadShard, removed by Prune);
//   - logs/rank-N.log: each rank's log, written once the run has
//     something worth keeping (Log);
//   - report.html: the run's report (package reports writes it);
//   - .lock: while a process trains in the folder (Lock).
//
// It knows nothing of training: package train decides what is written
// when, and makes the ranks agree on it. Its refusals (ErrRefused) speak
// the train command's flags (-out, -resume), since that is what a person
// changes to fix them.
package rundir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
)

// The files and folders of a run folder.
const (
	RunFile        = "run.json"
	MetricsFile    = "metrics.jsonl"
	ReportFile     = "report.html"
	checkpointsDir = "checkpoints"
	logsDir        = "logs"
	lockFile       = ".lock"
)

// ErrRefused is matched (errors.Is) by the errors of a folder that cannot
// be used as asked: it is no run, another process trains in it, it holds a
// run already, it has no checkpoint to continue from. Their messages say
// what to change; the trainer reports them as configuration errors.
var ErrRefused = errors.New("rundir: the run folder cannot be used as asked")

// refusal is an error that matches ErrRefused and says only its message.
type refusal struct{ msg string }

func (e *refusal) Error() string        { return e.msg }
func (e *refusal) Is(target error) bool { return target == ErrRefused }

// refuse returns a refusal with the message format and a say.
func refuse(format string, a ...any) error { return &refusal{fmt.Sprintf(format, a...)} }

// Create makes the run's folder dir and its checkpoints folder (nothing
// when they exist).
func Create(dir string) error {
	return os.MkdirAll(filepath.Join(dir, checkpointsDir), 0o755)
}

// CheckFresh refuses (ErrRefused) to start a new run in dir when it already
// holds one, so that a repeated command never overwrites earlier results,
// and when it is a folder of other files (a run would be written beside
// them). A missing or empty folder is fresh, and so is one that holds only
// what a run writes (a new run that failed before its first step) and
// files named sweep-* (the markers of package sweep, which makes a run's
// folder before the run).
func CheckFresh(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, RunFile)); err == nil {
		return refuse("-out %s already holds a run (run.json); pass another -out, continue it with -resume %s, or delete the folder", dir, dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // missing (the run creates it), or Create will say why not
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case n == MetricsFile || n == ReportFile || n == checkpointsDir || n == logsDir || n == lockFile || strings.HasPrefix(n, "sweep-"):
		default:
			return refuse("-out %s is a folder of other files (%s, …), not a run's: a run would be written beside them; pass a new or empty folder as -out (e.g. %s)",
				dir, n, filepath.Join(dir, "run"))
		}
	}
	return nil
}

// Discard removes what a new run that failed before it had anything worth
// keeping (its first step, a checkpoint) wrote in its folder dir: rank 0's
// run.json, metrics.jsonl and report.html (rank0: this process holds rank
// 0), the empty checkpoints/ and logs/ folders and, when the run created it
// (created), the folder. Whatever else is there stays.
func Discard(dir string, rank0, created bool) {
	if rank0 {
		for _, f := range []string{RunFile, MetricsFile, ReportFile} {
			os.Remove(filepath.Join(dir, f))
		}
	}
	os.Remove(filepath.Join(dir, checkpointsDir)) // only when empty, as the rest
	os.Remove(filepath.Join(dir, logsDir))
	if created {
		os.Remove(dir)
	}
}

// WriteRun replaces dir's run.json with info, as indented JSON.
func WriteRun(dir string, info any) error {
	return atomicfile.WriteJSON(filepath.Join(dir, RunFile), info)
}

// ReadRun reads the run.json of the run to resume in dir into info. A
// folder that is missing or holds no run.json is refused (ErrRefused).
func ReadRun(dir string, info any) error {
	p := filepath.Join(dir, RunFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return refuse("-resume %s: no such folder; give the run directory a run wrote with -out", dir)
		}
		return refuse("-resume %s: no run.json there: not a run directory (give the folder a run wrote with -out)", dir)
	}
	if err != nil {
		return fmt.Errorf("-resume %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, info); err != nil {
		return fmt.Errorf("-resume %s: run.json is damaged: %w", dir, err)
	}
	return nil
}
