package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sort"
)

const ckptMagic = "SGCKPT01"

// Checkpoint is the state a run leaves at an epoch boundary (or where -steps
// stopped it): rank 0's parameters, buffers and optimizer state.
type Checkpoint struct {
	Model   string `json:"model"`
	Dataset string `json:"dataset"`
	// Epoch is the 0-based epoch to continue in and Batch the batch of that
	// epoch to continue from; Step is the number of iterations done.
	Epoch, Batch, Step int
	OptSteps           int64 `json:"opt_steps"`
	Params             []float32
	Buffers            []float32
	Opt                [][]float32
}

type ckptHeader struct {
	Model    string `json:"model"`
	Dataset  string `json:"dataset"`
	Epoch    int    `json:"epoch"`
	Batch    int    `json:"batch"`
	Step     int    `json:"step"`
	OptSteps int64  `json:"opt_steps"`
	Params   int    `json:"params"`
	Buffers  int    `json:"buffers"`
	Opt      []int  `json:"opt"`
}

// WriteCheckpoint writes ck to path atomically (a temporary file, synced,
// then renamed), so a crash never leaves a half-written checkpoint.
func WriteCheckpoint(path string, ck *Checkpoint) error {
	h := ckptHeader{Model: ck.Model, Dataset: ck.Dataset, Epoch: ck.Epoch, Batch: ck.Batch, Step: ck.Step,
		OptSteps: ck.OptSteps, Params: len(ck.Params), Buffers: len(ck.Buffers)}
	for _, v := range ck.Opt {
		h.Opt = append(h.Opt, len(v))
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return err
	}
	var body bytes.Buffer
	for _, v := range append([][]float32{ck.Params, ck.Buffers}, ck.Opt...) {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		body.Write(b)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ckpt-*")
	if err != nil {
		return fmt.Errorf("train: writing checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	var pre [16]byte
	copy(pre[:8], ckptMagic)
	binary.LittleEndian.PutUint32(pre[8:], uint32(len(hj)))
	binary.LittleEndian.PutUint32(pre[12:], crc32.ChecksumIEEE(body.Bytes()))
	for _, b := range [][]byte{pre[:], hj, body.Bytes()} {
		if _, err := tmp.Write(b); err != nil {
			tmp.Close()
			return fmt.Errorf("train: writing checkpoint: %w", err)
		}
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("train: writing checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("train: writing checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("train: writing checkpoint: %w", err)
	}
	return nil
}

// ReadCheckpoint reads a checkpoint written by WriteCheckpoint. A truncated
// or corrupted file is an error naming the file.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("train: reading checkpoint: %w", err)
	}
	return parseCheckpoint(b, path)
}

func parseCheckpoint(b []byte, name string) (*Checkpoint, error) {
	bad := func(what string) error {
		return fmt.Errorf("train: %s is not a valid checkpoint: %s", name, what)
	}
	if len(b) < 16 || string(b[:8]) != ckptMagic {
		return nil, bad("missing the " + ckptMagic + " header")
	}
	hl := int(binary.LittleEndian.Uint32(b[8:]))
	sum := binary.LittleEndian.Uint32(b[12:])
	if hl > len(b)-16 {
		return nil, bad("truncated header")
	}
	var h ckptHeader
	if err := json.Unmarshal(b[16:16+hl], &h); err != nil {
		return nil, bad("header: " + err.Error())
	}
	body := b[16+hl:]
	sizes := append([]int{h.Params, h.Buffers}, h.Opt...)
	total := 0
	for _, s := range sizes {
		if s < 0 || s > len(body)/4 {
			return nil, bad("vector sizes do not match the file size (truncated?)")
		}
		total += s
	}
	if total*4 != len(body) {
		return nil, bad(fmt.Sprintf("%d bytes of data, header says %d (truncated?)", len(body), total*4))
	}
	if crc32.ChecksumIEEE(body) != sum {
		return nil, bad("checksum mismatch (corrupted)")
	}
	vecs := make([][]float32, len(sizes))
	off := 0
	for i, s := range sizes {
		v := make([]float32, s)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(body[off+4*j:]))
		}
		off += 4 * s
		vecs[i] = v
	}
	return &Checkpoint{Model: h.Model, Dataset: h.Dataset, Epoch: h.Epoch, Batch: h.Batch, Step: h.Step,
		OptSteps: h.OptSteps, Params: vecs[0], Buffers: vecs[1], Opt: vecs[2:]}, nil
}

// LatestCheckpoint returns the path of the newest checkpoint in runDir's
// checkpoints folder.
func LatestCheckpoint(runDir string) (string, error) {
	m, err := filepath.Glob(filepath.Join(runDir, "checkpoints", "step-*.ckpt"))
	if err != nil {
		return "", err
	}
	if len(m) == 0 {
		return "", fmt.Errorf("train: no checkpoint in %s: %w", filepath.Join(runDir, "checkpoints"), os.ErrNotExist)
	}
	sort.Strings(m)
	return m[len(m)-1], nil
}
