package rundir

import (
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// SharedFile is the name of a checkpoint's shared part, the file whose
// presence makes the checkpoint complete.
const SharedFile = "shared.ckpt"

// stepPrefix begins the name of a checkpoint's folder.
const stepPrefix = "step-"

// CheckpointDir is the folder of the checkpoint at step of the run in dir.
func CheckpointDir(dir string, step int) string {
	return filepath.Join(dir, checkpointsDir, fmt.Sprintf("%s%09d", stepPrefix, step))
}

// ShardFile is the name of rank's part of a checkpoint.
func ShardFile(rank int) string { return fmt.Sprintf("rank-%04d.ckpt", rank) }

// checkpointSteps lists the steps of the checkpoint folders of the run in dir,
// newest first (complete or not).
func checkpointSteps(dir string) ([]int, error) {
	ents, err := os.ReadDir(filepath.Join(dir, checkpointsDir))
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), stepPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// Latest returns the folder of the newest complete checkpoint of the run
// in dir (one whose shared part rank 0 has written); an error wrapping
// os.ErrNotExist when there is none.
func Latest(dir string) (string, error) {
	steps, err := checkpointSteps(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	for _, s := range steps {
		d := CheckpointDir(dir, s)
		if _, err := os.Stat(filepath.Join(d, SharedFile)); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no complete checkpoint in %s: %w", filepath.Join(dir, checkpointsDir), os.ErrNotExist)
}

// ReadCheckpoint reads the shared part of the checkpoint in folder ckDir.
func ReadCheckpoint[C any](ckDir string) (*Checkpoint[C], error) {
	p := filepath.Join(ckDir, SharedFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint: %w", err)
	}
	return ParseCheckpoint[C](b, p)
}

// ReadLatest reads the shared part of the newest complete checkpoint of
// the run in dir, to resume it: the checkpoint's folder, the file's bytes
// (which rank 0 broadcasts) and what they hold. A run without one, with
// only checkpoints of an older version, or whose newest one is damaged is
// refused (ErrRefused) saying what to do.
func ReadLatest[C any](dir string) (ckDir string, raw []byte, ck *Checkpoint[C], err error) {
	ckDir, err = Latest(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if old, _ := filepath.Glob(filepath.Join(dir, checkpointsDir, "step-*.ckpt")); len(old) > 0 {
				return "", nil, nil, refuse("-resume %s: its checkpoints (%s, ...) are of an older version that kept only rank 0's parameters and optimizer state; they cannot continue the run exactly: start it again with -out", dir, filepath.Base(old[0]))
			}
			return "", nil, nil, refuse("-resume %s: the run has no complete checkpoint to continue from (it stopped before its first one); start it again with -out", dir)
		}
		return "", nil, nil, err
	}
	p := filepath.Join(ckDir, SharedFile)
	if raw, err = os.ReadFile(p); err != nil {
		return "", nil, nil, fmt.Errorf("reading checkpoint: %w", err)
	}
	if ck, err = ParseCheckpoint[C](raw, p); err != nil {
		return "", nil, nil, refuse("%v; %s", err, FallBack(dir, ckDir))
	}
	return ckDir, raw, ck, nil
}

// ReadShard reads rank's part of checkpoint ck, in folder ckDir, and checks
// that it is the part ck lists (size and CRC-32C) and ck's rank, worker
// count and step.
func (ck *Checkpoint[C]) ReadShard(ckDir string, rank int) (*Shard, error) {
	p := filepath.Join(ckDir, ShardFile(rank))
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading this rank's part: %w", err)
	}
	if want := ck.Shards[rank]; int64(len(b)) != want.Bytes || crc32.Checksum(b, castagnoli) != want.CRC {
		return nil, fmt.Errorf("%s is not the part the checkpoint lists (%d bytes, CRC-32C %08x; the checkpoint says %d bytes, %08x): it is of another checkpoint, or damaged", p, len(b), crc32.Checksum(b, castagnoli), want.Bytes, want.CRC)
	}
	s, err := parseShard(b, p)
	if err != nil {
		return nil, err
	}
	if s.Rank != rank || s.Workers != ck.Workers || s.Step != ck.Step {
		return nil, fmt.Errorf("%s is rank %d of %d at step %d, not rank %d of %d at step %d", p, s.Rank, s.Workers, s.Step, rank, ck.Workers, ck.Step)
	}
	return s, nil
}

// WriteShard writes s, its rank's part of the checkpoint at s.Step of the
// run in dir (creating the checkpoint's folder), and returns the size and
// CRC-32C that the shared part records for it.
func WriteShard(dir string, s *Shard) (ShardInfo, error) {
	names, data := shardSections(s)
	f, err := layoutFile("rank", s, names, data)
	if err != nil {
		return ShardInfo{}, err
	}
	ckDir := CheckpointDir(dir, s.Step)
	if err := os.MkdirAll(ckDir, 0o755); err != nil {
		return ShardInfo{}, err
	}
	return writeFile(filepath.Join(ckDir, ShardFile(s.Rank)), f)
}

// WriteShared writes ck, the shared part of the checkpoint at ck.Step of
// the run in dir, which completes the checkpoint: every rank's part must
// be written first.
func WriteShared[C any](dir string, ck *Checkpoint[C]) error {
	names, data := sharedSections(ck)
	f, err := layoutFile("shared", ck, names, data)
	if err != nil {
		return err
	}
	_, err = writeFile(filepath.Join(CheckpointDir(dir, ck.Step), SharedFile), f)
	return err
}

// RemoveShard removes rank's part of the checkpoint at step, which was not
// completed, and its folder if nothing else is left in it.
func RemoveShard(dir string, step, rank int) {
	ckDir := CheckpointDir(dir, step)
	os.Remove(filepath.Join(ckDir, ShardFile(rank)))
	os.Remove(ckDir) // only if empty
}

// Prune removes rank's files of the checkpoints of the run in dir older
// than step keep (the newest two stay: keep is the one before the newest;
// nothing when it is negative); rank 0 removes their shared parts first,
// so they are never taken for complete. Failures are logged, not returned.
func Prune(dir string, rank, keep int, log *slog.Logger) {
	if keep < 0 {
		return
	}
	steps, err := checkpointSteps(dir)
	if err != nil {
		log.Warn("listing old checkpoints", "err", err)
		return
	}
	for _, s := range steps {
		if s < keep {
			remove(dir, s, rank, log)
		}
	}
}

// RemoveAfter removes rank's files of the checkpoints of the run in dir
// newer than step: the parts of incomplete ones, which a crash while
// writing them left, when the run resumes from step.
func RemoveAfter(dir string, step, rank int, log *slog.Logger) {
	steps, err := checkpointSteps(dir)
	if err != nil {
		return
	}
	for _, s := range steps {
		if s > step {
			remove(dir, s, rank, log)
		}
	}
}

// remove removes rank's files of the checkpoint at step (rank 0: the
// shared part first, then the folder).
func remove(dir string, step, rank int, log *slog.Logger) {
	d := CheckpointDir(dir, step)
	if rank == 0 {
		if err := os.Remove(filepath.Join(d, SharedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("removing an old checkpoint", "err", err)
			return
		}
	}
	os.Remove(filepath.Join(d, ShardFile(rank)))
	if rank == 0 {
		os.RemoveAll(d)
	} else {
		os.Remove(d)
	}
}

// FallBack says how to resume the run in dir when its checkpoint in
// folder bad, the newest complete one, cannot be used: from the complete
// one before it, if there is one (on this machine).
func FallBack(dir, bad string) string {
	steps, _ := checkpointSteps(dir)
	seen := false
	for _, s := range steps { // newest first
		d := CheckpointDir(dir, s)
		if !seen {
			seen = d == bad
			continue
		}
		if _, err := os.Stat(filepath.Join(d, SharedFile)); err == nil {
			return fmt.Sprintf("move %s away to resume from the one before it, %s (step %d)", bad, d, s)
		}
	}
	return "there is no earlier complete checkpoint: start the run again with another -out"
}
