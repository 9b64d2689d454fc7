package rundir

import (
	"bytes"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleConfig stands for a run's configuration (train.Config).
type sampleConfig struct {
	Model, Dataset, Sparsifier string
	Density                    float64
}

func sampleCheckpoint() (*Checkpoint[sampleConfig], *Shard) {
	ck := &Checkpoint[sampleConfig]{Config: sampleConfig{Model: "ncf", Dataset: "ml-100k", Sparsifier: "micro", Density: 0.1}, Workers: 2,
		Epoch: 2, Batch: 5, Step: 77, EvalDue: true, EvalEpoch: 1, Elapsed: 3 * time.Second, OptSteps: 77,
		Shards: []ShardInfo{{10, 1}, {20, 2}}, Written: time.Unix(1700000000, 0).UTC(),
		Params: []float32{1, -2, 3.5}, Opt: [][]float32{{1, 2, 3}, {4, 5, 6}}}
	sh := &Shard{Rank: 1, Workers: 2, Step: 77, Residual: []float32{0.5, 0, -1}, Buffers: []float32{},
		Reducer: []byte("state"), Model: []byte{}}
	return ck, sh
}

// TestCheckpointFilesRoundTrip: both parts read back as written, and every
// damage (empty, another magic, an older format, truncation anywhere, a
// flipped bit anywhere, another kind) is refused with a message naming the
// file.
func TestCheckpointFilesRoundTrip(t *testing.T) {
	ck, sh := sampleCheckpoint()
	b, err := encodeShared(ck)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseCheckpoint[sampleConfig](b, "s")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ck) {
		t.Fatalf("shared part: got %+v, want %+v", got, ck)
	}
	sb, err := encodeShard(sh)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := parseShard(sb, "r")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gs, sh) {
		t.Fatalf("rank part: got %+v, want %+v", gs, sh)
	}
	if _, err := parseShard(b, "x.ckpt"); err == nil || !strings.Contains(err.Error(), `a "shared" part`) {
		t.Errorf("a shared part read as a rank's: %v", err)
	}
	old := append([]byte("SGCKPT01"), b[8:]...)
	for name, bad := range map[string][]byte{"empty": nil, "magic": append([]byte("XXXXXXXX"), b[8:]...), "old format": old} {
		if _, err := ParseCheckpoint[sampleConfig](bad, "x.ckpt"); err == nil || !strings.Contains(err.Error(), "x.ckpt is not a valid checkpoint file") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseCheckpoint[sampleConfig](old, "x.ckpt"); !strings.Contains(err.Error(), "another version") {
		t.Errorf("old format: %v", err)
	}
	for n := range len(b) {
		if _, err := ParseCheckpoint[sampleConfig](b[:n], "x"); err == nil {
			t.Fatalf("truncated to %d of %d bytes: accepted", n, len(b))
		}
	}
	for i := range len(b) {
		for bit := range 8 {
			f := bytes.Clone(b)
			f[i] ^= 1 << bit
			if _, err := ParseCheckpoint[sampleConfig](f, "x"); err == nil {
				t.Fatalf("bit %d of byte %d flipped: accepted", bit, i)
			}
		}
	}
}

// TestLatestCheckpoint picks the newest folder holding a shared part.
func TestLatestCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if _, err := Latest(dir); err == nil {
		t.Fatal("a checkpoint in an empty folder")
	}
	for _, s := range []int{5, 10, 20} {
		os.MkdirAll(CheckpointDir(dir, s), 0o755)
	}
	os.WriteFile(filepath.Join(CheckpointDir(dir, 5), SharedFile), nil, 0o644)
	os.WriteFile(filepath.Join(CheckpointDir(dir, 10), SharedFile), nil, 0o644)
	os.WriteFile(filepath.Join(CheckpointDir(dir, 20), ShardFile(0)), nil, 0o644) // incomplete
	if got, err := Latest(dir); err != nil || got != CheckpointDir(dir, 10) {
		t.Fatalf("Latest = %q, %v", got, err)
	}
}

// FuzzParseCheckpoint: the readers of both parts never panic, and what they
// accept writes back to the same bytes (nothing is half-read).
func FuzzParseCheckpoint(f *testing.F) {
	ck, sh := sampleCheckpoint()
	b, _ := encodeShared(ck)
	f.Add(b)
	sb, _ := encodeShard(sh)
	f.Add(sb)
	f.Add([]byte(ckptMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		if ck, err := ParseCheckpoint[sampleConfig](b, "fuzz"); err == nil {
			back, err := encodeShared(ck)
			if err != nil {
				t.Fatal(err)
			}
			ck2, err := ParseCheckpoint[sampleConfig](back, "back")
			if err != nil {
				t.Fatalf("re-encoded shared part refused: %v", err)
			}
			if again, _ := encodeShared(ck2); !bytes.Equal(again, back) {
				t.Fatal("the shared part does not read back as written")
			}
		}
		if sh, err := parseShard(b, "fuzz"); err == nil {
			back, err := encodeShard(sh)
			if err != nil {
				t.Fatal(err)
			}
			sh2, err := parseShard(back, "back")
			if err != nil {
				t.Fatalf("re-encoded rank part refused: %v", err)
			}
			if again, _ := encodeShard(sh2); !bytes.Equal(again, back) {
				t.Fatal("the rank part does not read back as written")
			}
		}
	})
}

// TestCheckpointFileStreamed: a part streamed to its file (writeFile)
// is byte for byte the part's encoding, for sections of several chunks and
// an odd size, and its recorded size and CRC are the file's.
func TestCheckpointFileStreamed(t *testing.T) {
	_, sh := sampleCheckpoint()
	sh.Residual = make([]float32, 3*4096+7)
	for i := range sh.Residual {
		sh.Residual[i] = float32(i%251) - 125.5
	}
	want, err := encodeShard(sh)
	if err != nil {
		t.Fatal(err)
	}
	names, data := shardSections(sh)
	f, err := layoutFile("rank", sh, names, data)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), ShardFile(1))
	info, err := writeFile(path, f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the streamed file (%d bytes) differs from the encoding (%d bytes)", len(got), len(want))
	}
	if info.Bytes != int64(len(want)) || info.CRC != crc32.Checksum(want, castagnoli) {
		t.Errorf("recorded %+v; the file has %d bytes and CRC %#x", info, len(want), crc32.Checksum(want, castagnoli))
	}
	if back, err := parseShard(got, path); err != nil || !slices.Equal(back.Residual, sh.Residual) {
		t.Errorf("read back: %v", err)
	}
}

// encodeFile returns the bytes of a checkpoint file (the trainer streams
// its files with writeFile).
func encodeFile(kind string, meta any, names []string, data []section) ([]byte, error) {
	f, err := layoutFile(kind, meta, names, data)
	if err != nil {
		return nil, err
	}
	p, err := f.prefix()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(f.size())
	b.Write(p[:])
	if err := f.writeBody(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// encodeShared returns shared.ckpt's bytes.
func encodeShared[C any](ck *Checkpoint[C]) ([]byte, error) {
	names, data := sharedSections(ck)
	return encodeFile("shared", ck, names, data)
}

// encodeShard returns rank-NNNN.ckpt's bytes.
func encodeShard(s *Shard) ([]byte, error) {
	names, data := shardSections(s)
	return encodeFile("rank", s, names, data)
}
