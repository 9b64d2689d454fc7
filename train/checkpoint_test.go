package train

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "checkpoints"), 0o755)
	for _, ck := range []*Checkpoint{
		{Model: "ncf", Dataset: "ml-100k", Epoch: 2, Batch: 5, Step: 77, OptSteps: 77, Params: []float32{1, -2, 3.5}, Buffers: []float32{}, Opt: [][]float32{{1, 2, 3}, {4, 5, 6}}},
		{Model: "lstm", Dataset: "wikitext2", Params: []float32{}, Buffers: []float32{}, Opt: [][]float32{}},
	} {
		p := filepath.Join(dir, "checkpoints", "step-000000001.ckpt")
		if err := WriteCheckpoint(p, ck); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCheckpoint(p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, ck) {
			t.Fatalf("round trip: got %+v, want %+v", got, ck)
		}
		if l, err := LatestCheckpoint(dir); err != nil || l != p {
			t.Fatalf("LatestCheckpoint = %q, %v", l, err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "checkpoints", "step-000000001.ckpt"))
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("XXXXXXXX"), b[8:]...),
		"truncated": b[:len(b)-4],
	} {
		if _, err := parseCheckpoint(bad, name); err == nil || !strings.Contains(err.Error(), "not a valid checkpoint") {
			t.Errorf("%s: err %v", name, err)
		}
	}
	// A flipped bit in the data is caught by the checksum.
	ck := &Checkpoint{Model: "ncf", Params: []float32{1, 2}}
	p := filepath.Join(dir, "c.ckpt")
	WriteCheckpoint(p, ck)
	b, _ = os.ReadFile(p)
	b[len(b)-1] ^= 1
	if _, err := parseCheckpoint(b, "flip"); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("bit flip: %v", err)
	}
	if _, err := LatestCheckpoint(t.TempDir()); err == nil {
		t.Error("LatestCheckpoint found a checkpoint in an empty folder")
	}
}

func FuzzParseCheckpoint(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "c.ckpt")
	WriteCheckpoint(p, &Checkpoint{Model: "ncf", Params: []float32{1, 2}, Opt: [][]float32{{3}}})
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Add([]byte(ckptMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		ck, err := parseCheckpoint(b, "fuzz")
		if err != nil {
			return
		}
		// Whatever parses must round-trip.
		q := filepath.Join(t.TempDir(), "r.ckpt")
		if err := WriteCheckpoint(q, ck); err != nil {
			t.Fatal(err)
		}
		ck2, err := ReadCheckpoint(q)
		if err != nil {
			t.Fatal(err)
		}
		if len(ck2.Params) != len(ck.Params) || len(ck2.Opt) != len(ck.Opt) {
			t.Fatalf("round trip changed sizes")
		}
	})
}
