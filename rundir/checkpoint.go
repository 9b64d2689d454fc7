package rundir

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
)

// A checkpoint is a folder checkpoints/step-NNNNNNNNN of the run's folder
// holding everything a run needs to continue exactly as if it had not
// stopped:
//
//   - shared.ckpt, written by rank 0: the position (epoch, batch, step), the
//     configuration, the wall time so far, the parameters and the optimizer
//     state (the same on every rank), and the size and checksum of every
//     rank's part;
//   - rank-NNNN.ckpt, one per rank, written by that rank (on its own
//     machine under mpirun): its error-feedback residual, its batch-norm
//     statistics, its reducer's state (sparsify.Reducer.State) and its model's
//     state (models.Stateful: dropout stream, LSTM hidden state).
//
// Every file is written atomically (package atomicfile). Rank 0 writes
// shared.ckpt only after every rank has written its part, so a folder with
// shared.ckpt is complete: a crash while checkpointing leaves the previous
// checkpoint as the newest complete one. On resume rank 0 reads
// shared.ckpt and broadcasts it, and every rank reads only its own part, so
// no shared file system is needed.
//
// Each file is a ckptMagic header, the length of a JSON header, a CRC-32C of
// the header and the data, the JSON header (the file's kind, its metadata
// and the names and sizes of its sections) and the sections' bytes.

const (
	ckptMagic  = "SGCKPT02"
	ckptFormat = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checkpoint is the shared part of a checkpoint (shared.ckpt), of a run
// whose configuration is a C (train.Config; json.RawMessage reads any).
type Checkpoint[C any] struct {
	// Config is the run's configuration when the checkpoint was written.
	Config C `json:"config"`
	// Workers is the number of ranks.
	Workers int `json:"workers"`
	// Epoch is the 0-based epoch to continue in and Batch the batch of that
	// epoch to continue from; Step is the number of iterations done.
	Epoch int `json:"epoch"`
	Batch int `json:"batch"`
	Step  int `json:"step"`
	// EvalDue says that an evaluation was due at Step (an epoch's end or
	// -eval-every) and is to be run first by a resumed run; EvalEpoch is
	// the 0-based epoch it belongs to.
	EvalDue   bool `json:"eval_due"`
	EvalEpoch int  `json:"eval_epoch"`
	// Elapsed is the run's wall time when the checkpoint was written
	// (across earlier resumes).
	Elapsed  time.Duration `json:"elapsed_ns"`
	OptSteps int64         `json:"opt_steps"`
	// Shards are the size and CRC-32C of every rank's part, by rank.
	Shards []ShardInfo `json:"shards"`
	// Written is when the checkpoint was written.
	Written time.Time `json:"written"`

	Params []float32   `json:"-"`
	Opt    [][]float32 `json:"-"`
}

// ShardInfo identifies one rank's part of a checkpoint.
type ShardInfo struct {
	Bytes int64  `json:"bytes"`
	CRC   uint32 `json:"crc32c"`
}

// Shard is one rank's part of a checkpoint (rank-NNNN.ckpt).
type Shard struct {
	Rank    int `json:"rank"`
	Workers int `json:"workers"`
	Step    int `json:"step"`

	Residual []float32 `json:"-"`
	Buffers  []float32 `json:"-"`
	Reducer  []byte    `json:"-"`
	Model    []byte    `json:"-"`
}

// ckptHeader is a file's JSON header.
type ckptHeader struct {
	Format   int             `json:"format"`
	Kind     string          `json:"kind"` // "shared" or "rank"
	Meta     json.RawMessage `json:"meta"`
	Sections []ckptSection   `json:"sections"`
}

type ckptSection struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

// ckptFile is a checkpoint file to write: its JSON header and its
// sections.
type ckptFile struct {
	header []byte
	data   []section
	bytes  int // the sections' bytes
}

// layoutFile lays out a checkpoint file.
func layoutFile(kind string, meta any, names []string, data []section) (*ckptFile, error) {
	mj, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	h := ckptHeader{Format: ckptFormat, Kind: kind, Meta: mj}
	f := &ckptFile{data: data}
	for i, n := range names {
		h.Sections = append(h.Sections, ckptSection{n, data[i].size()})
		f.bytes += data[i].size()
	}
	if f.header, err = json.Marshal(h); err != nil {
		return nil, err
	}
	return f, nil
}

// size is the file's size in bytes.
func (f *ckptFile) size() int { return 16 + len(f.header) + f.bytes }

// prefix is the file's first 16 bytes: the magic, the header's length and
// the CRC-32C of everything after them.
func (f *ckptFile) prefix() ([16]byte, error) {
	var p [16]byte
	copy(p[:], ckptMagic)
	binary.LittleEndian.PutUint32(p[8:], uint32(len(f.header)))
	h := crc32.New(castagnoli)
	if err := f.writeBody(h); err != nil {
		return p, err
	}
	binary.LittleEndian.PutUint32(p[12:], h.Sum32())
	return p, nil
}

// writeBody writes the header and the sections, float32s encoded a chunk
// at a time.
func (f *ckptFile) writeBody(w io.Writer) error {
	if _, err := w.Write(f.header); err != nil {
		return err
	}
	for _, d := range f.data {
		if d.f == nil {
			if _, err := w.Write(d.b); err != nil {
				return err
			}
			continue
		}
		if err := writeF32(w, d.f); err != nil {
			return err
		}
	}
	return nil
}

// writeF32 writes v little-endian, a chunk at a time.
func writeF32(w io.Writer, v []float32) error {
	var chunk [16 << 10]byte
	for len(v) > 0 {
		n := min(len(v), len(chunk)/4)
		for i, x := range v[:n] {
			binary.LittleEndian.PutUint32(chunk[4*i:], math.Float32bits(x))
		}
		if _, err := w.Write(chunk[:4*n]); err != nil {
			return err
		}
		v = v[n:]
	}
	return nil
}

// writeFile writes f to path (atomicfile.Write), streaming it
// from the vectors it holds: many workers of one process checkpoint at
// once, and a copy of each one's file in memory (its residual alone is a
// model's size) added 1.2 GB to the peak of 16 simulated ResNet-18
// workers. It returns the file's size and its CRC-32C (whole file), which
// the shared part records.
func writeFile(path string, f *ckptFile) (ShardInfo, error) {
	p, err := f.prefix() // a first pass over the data: the CRC of the body
	if err != nil {
		return ShardInfo{}, err
	}
	whole := crc32.New(castagnoli)
	err = atomicfile.Write(path, func(w io.Writer) error {
		bw := bufio.NewWriterSize(io.MultiWriter(w, whole), 1<<20)
		if _, err := bw.Write(p[:]); err != nil {
			return err
		}
		if err := f.writeBody(bw); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		return ShardInfo{}, err
	}
	return ShardInfo{Bytes: int64(f.size()), CRC: whole.Sum32()}, nil
}

// section is one section of a checkpoint file: bytes, or float32s stored
// little-endian.
type section struct {
	b []byte
	f []float32
}

func (s section) size() int { return len(s.b) + 4*len(s.f) }

// decodeFile checks a checkpoint file of the given kind and returns its
// metadata and sections by name. name names the file in errors.
func decodeFile(b []byte, kind, name string) (json.RawMessage, map[string][]byte, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s is not a valid checkpoint file: %s", name, fmt.Sprintf(format, a...))
	}
	if len(b) < 16 || string(b[:8]) != ckptMagic {
		if len(b) >= 8 && string(b[:6]) == ckptMagic[:6] {
			return nil, nil, bad("format %q; this build reads %s (written by another version)", b[:8], ckptMagic)
		}
		return nil, nil, bad("missing the %s header (truncated or not a checkpoint)", ckptMagic)
	}
	hl := int64(binary.LittleEndian.Uint32(b[8:]))
	if hl > int64(len(b)-16) {
		return nil, nil, bad("truncated header (%d bytes, the file has %d)", hl, len(b)-16)
	}
	if got, want := crc32.Checksum(b[16:], castagnoli), binary.LittleEndian.Uint32(b[12:]); got != want {
		return nil, nil, bad("checksum mismatch (the file is corrupted or truncated)")
	}
	var h ckptHeader
	if err := json.Unmarshal(b[16:16+hl], &h); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	if h.Format != ckptFormat {
		return nil, nil, bad("format %d; this build reads %d", h.Format, ckptFormat)
	}
	if h.Kind != kind {
		return nil, nil, bad("a %q part, not a %q part", h.Kind, kind)
	}
	body := b[16+hl:]
	secs := map[string][]byte{}
	off := 0
	for _, s := range h.Sections {
		if s.Bytes < 0 || s.Bytes > len(body)-off {
			return nil, nil, bad("section %q of %d bytes runs past the end of the file", s.Name, s.Bytes)
		}
		if _, dup := secs[s.Name]; dup {
			return nil, nil, bad("section %q twice", s.Name)
		}
		secs[s.Name] = body[off : off+s.Bytes]
		off += s.Bytes
	}
	if off != len(body) {
		return nil, nil, bad("%d bytes after the last section", len(body)-off)
	}
	return h.Meta, secs, nil
}

func bytesF32(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of float32s", len(b))
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}

// sharedSections are shared.ckpt's sections.
func sharedSections[C any](ck *Checkpoint[C]) ([]string, []section) {
	names := []string{"params"}
	data := []section{{f: ck.Params}}
	for i, v := range ck.Opt {
		names = append(names, "opt."+strconv.Itoa(i))
		data = append(data, section{f: v})
	}
	return names, data
}

// ParseCheckpoint reads the bytes of a shared part (shared.ckpt, as rank 0
// broadcasts them on a resume); name names the file in errors.
func ParseCheckpoint[C any](b []byte, name string) (*Checkpoint[C], error) {
	meta, secs, err := decodeFile(b, "shared", name)
	if err != nil {
		return nil, err
	}
	ck := &Checkpoint[C]{}
	if err := json.Unmarshal(meta, ck); err != nil {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: metadata: %w", name, err)
	}
	if ck.Workers < 1 || len(ck.Shards) != ck.Workers || ck.Step < 0 || ck.Epoch < 0 || ck.Batch < 0 || ck.Elapsed < 0 {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: impossible position or worker count (%d workers, %d parts, step %d)", name, ck.Workers, len(ck.Shards), ck.Step)
	}
	vec := func(n string) ([]float32, error) {
		s, ok := secs[n]
		if !ok {
			return nil, fmt.Errorf("%s is not a valid checkpoint file: no %s section", name, n)
		}
		v, err := bytesF32(s)
		if err != nil {
			return nil, fmt.Errorf("%s is not a valid checkpoint file: section %s: %w", name, n, err)
		}
		return v, nil
	}
	if ck.Params, err = vec("params"); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		n := "opt." + strconv.Itoa(i)
		if _, ok := secs[n]; !ok {
			if len(secs) != 1+i {
				return nil, fmt.Errorf("%s is not a valid checkpoint file: %d unknown sections", name, len(secs)-1-i)
			}
			break
		}
		v, err := vec(n)
		if err != nil {
			return nil, err
		}
		ck.Opt = append(ck.Opt, v)
	}
	return ck, nil
}

// shardSections are rank-NNNN.ckpt's sections.
func shardSections(s *Shard) ([]string, []section) {
	return []string{"residual", "buffers", "reducer", "model"},
		[]section{{f: s.Residual}, {f: s.Buffers}, {b: s.Reducer}, {b: s.Model}}
}

// parseShard reads a rank's part; name names the file in errors.
func parseShard(b []byte, name string) (*Shard, error) {
	meta, secs, err := decodeFile(b, "rank", name)
	if err != nil {
		return nil, err
	}
	s := &Shard{}
	if err := json.Unmarshal(meta, s); err != nil {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: metadata: %w", name, err)
	}
	for _, n := range []string{"residual", "buffers", "reducer", "model"} {
		if _, ok := secs[n]; !ok {
			return nil, fmt.Errorf("%s is not a valid checkpoint file: no %s section", name, n)
		}
	}
	if len(secs) != 4 {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: %d unknown sections", name, len(secs)-4)
	}
	if s.Residual, err = bytesF32(secs["residual"]); err == nil {
		s.Buffers, err = bytesF32(secs["buffers"])
	}
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: %w", name, err)
	}
	s.Reducer = bytes.Clone(secs["reducer"])
	s.Model = bytes.Clone(secs["model"])
	if s.Workers < 1 || s.Rank < 0 || s.Rank >= s.Workers || s.Step < 0 {
		return nil, fmt.Errorf("%s is not a valid checkpoint file: rank %d of %d workers", name, s.Rank, s.Workers)
	}
	return s, nil
}

// Checksum is the CRC-32C of v's bytes as a checkpoint stores them
// (little-endian), computed a chunk at a time: the ranks compare their
// parameters by it.
func Checksum(v []float32) uint32 {
	h := crc32.New(castagnoli)
	writeF32(h, v) // a hash's Write never fails
	return h.Sum32()
}
