package data

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"unicode/utf8"
)

// EOS is the token appended at the end of every line of a WikiText file.
const EOS = "<eos>"

// maxLineBytes bounds one line of a token file; a longer line is an error
// (WikiText-2's longest line is about 4 KiB; a binary file has none).
const maxLineBytes = 1 << 20

// Vocab maps words to dense ids 0..Len()-1.
type Vocab struct {
	Words []string         // id -> word
	ids   map[string]int32 // word -> id
}

// NewVocab returns an empty vocabulary.
func NewVocab() *Vocab { return &Vocab{ids: make(map[string]int32)} }

// Len returns the number of words.
func (v *Vocab) Len() int { return len(v.Words) }

// ID returns the id of w and whether w is in the vocabulary.
func (v *Vocab) ID(w string) (int32, bool) {
	id, ok := v.ids[w]
	return id, ok
}

// add returns the id of w, adding it if it is new.
func (v *Vocab) add(w []byte) int32 {
	if id, ok := v.ids[string(w)]; ok { // no allocation for the lookup
		return id
	}
	s := string(w)
	id := int32(len(v.Words))
	v.Words = append(v.Words, s)
	v.ids[s] = id
	return id
}

// WikiText is the WikiText-2 corpus as id streams over one vocabulary.
//
// Convention (that of the PyTorch word-language-model example, which the
// published 33,278-word vocabulary and 2,088,628 training tokens follow): each
// line, blank lines included, is split on white space and followed by <eos>;
// the vocabulary is built over train, then valid, then test, with ids in order
// of first occurrence; the data sets' own <unk> is an ordinary word. Nothing is
// lower-cased (the reference code's spaCy tokenisation and lower-casing differ
// and give a smaller vocabulary).
type WikiText struct {
	Vocab              *Vocab
	Train, Valid, Test []int32
}

// wikiNames lists, per split, the accepted file names: the official
// wiki.*.tokens and the train/valid/test.txt copies.
var wikiNames = [3][2]string{
	{"wiki.train.tokens", "train.txt"},
	{"wiki.valid.tokens", "valid.txt"},
	{"wiki.test.tokens", "test.txt"},
}

// LoadWikiText reads WikiText-2 from dir: the folder holding
// wiki.{train,valid,test}.tokens (or train/valid/test.txt), or its parent
// holding wikitext-2/.
func LoadWikiText(dir string) (*WikiText, error) {
	base := dir
	if _, err := findWikiFile(dir, 0); err != nil {
		if _, err2 := findWikiFile(filepath.Join(dir, "wikitext-2"), 0); err2 == nil {
			base = filepath.Join(dir, "wikitext-2")
		}
	}
	w := &WikiText{Vocab: NewVocab()}
	dst := [3]*[]int32{&w.Train, &w.Valid, &w.Test}
	for s := 0; s < 3; s++ {
		path, err := findWikiFile(base, s)
		if err != nil {
			return nil, missing(err, "wikitext2", dir)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		ids, err := ParseTokens(f, path, w.Vocab, nil)
		f.Close()
		if err != nil {
			return nil, err
		}
		*dst[s] = ids
	}
	return w, nil
}

func findWikiFile(dir string, split int) (string, error) {
	for _, n := range wikiNames[split] {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("data: neither %s nor %s in %s: %w", wikiNames[split][0], wikiNames[split][1], dir, fs.ErrNotExist)
}

// ParseTokens reads a token file from r, appends each word's id (adding new
// words to vocab) and an <eos> id per line to dst, and returns dst. name is
// used in errors. An empty input, a NUL byte, invalid UTF-8 or a line longer
// than 1 MiB is an error naming the line: such a file is not a token file.
func ParseTokens(r io.Reader, name string, vocab *Vocab, dst []int32) ([]int32, error) {
	eos := []byte(EOS)
	lines := 0
	err := eachLine(r, name, func(_ int, b []byte) error {
		if !utf8.Valid(b) {
			return errors.New("not valid UTF-8: not a WikiText token file")
		}
		for _, w := range bytes.Fields(b) {
			dst = append(dst, vocab.add(w))
		}
		dst = append(dst, vocab.add(eos))
		lines++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if lines == 0 {
		return nil, fmt.Errorf("data: %s: empty file: want WikiText lines of space-separated tokens", name)
	}
	return dst, nil
}

// BPTTConfig configures per-rank BPTT batches of a token stream.
type BPTTConfig struct {
	Batch int // columns (sequences) per rank, e.g. 32
	BPTT  int // time steps per window, e.g. 30
	Rank  int // this worker's rank
	Size  int // number of workers
}

// TokenBatch is one BPTT window: inputs and next-token targets, time-major
// (element t*Batch+j is time step t of column j). Slices are owned by the
// loader and overwritten by the next call.
type TokenBatch struct {
	Steps  int     // time steps in this window (the last window may be shorter than BPTT)
	Batch  int     // columns
	Input  []int32 // Steps×Batch
	Target []int32 // Steps×Batch: the token after each input token
}

// BPTTLoader cuts a token stream into Batch·Size columns (the global batch),
// each a contiguous segment of the stream of Rows() tokens (the tail that does
// not fill a whole row is dropped), and serves rank r the columns
// [r·Batch, (r+1)·Batch) in windows of BPTT time steps: window i covers rows
// [i·BPTT, min((i+1)·BPTT, Rows()-1)) and targets are the next row. So n ranks
// together see exactly the global batch of the single-worker loader with
// Batch·n columns. Hidden state may be carried from window to window.
type BPTTLoader struct {
	cfg    BPTTConfig
	tokens []int32
	rows   int
	batch  TokenBatch
}

// NewBPTTLoader returns a loader over tokens.
func NewBPTTLoader(tokens []int32, cfg BPTTConfig) (*BPTTLoader, error) {
	if cfg.Batch < 1 || cfg.BPTT < 1 {
		return nil, fmt.Errorf("data: BPTT batch %d and length %d: both must be >= 1", cfg.Batch, cfg.BPTT)
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("data: rank %d of %d workers: want size >= 1 and 0 <= rank < size", cfg.Rank, cfg.Size)
	}
	cols := cfg.Batch * cfg.Size
	rows := len(tokens) / cols
	if rows < 2 {
		return nil, fmt.Errorf("data: %d tokens make %d rows of %d columns (%d per worker × %d workers): need at least 2 rows; use a smaller batch", len(tokens), rows, cols, cfg.Batch, cfg.Size)
	}
	l := &BPTTLoader{cfg: cfg, tokens: tokens, rows: rows}
	l.batch = TokenBatch{Batch: cfg.Batch, Input: make([]int32, cfg.BPTT*cfg.Batch), Target: make([]int32, cfg.BPTT*cfg.Batch)}
	return l, nil
}

// Rows returns the length of every column.
func (l *BPTTLoader) Rows() int { return l.rows }

// Len returns the number of windows: ceil((Rows()-1)/BPTT).
func (l *BPTTLoader) Len() int { return (l.rows - 1 + l.cfg.BPTT - 1) / l.cfg.BPTT }

// Batch returns window i (0 <= i < Len). It allocates nothing.
func (l *BPTTLoader) Batch(i int) (*TokenBatch, error) {
	if i < 0 || i >= l.Len() {
		return nil, fmt.Errorf("data: BPTT window %d out of range: have %d", i, l.Len())
	}
	start := i * l.cfg.BPTT
	steps := min(l.cfg.BPTT, l.rows-1-start)
	b := &l.batch
	B := l.cfg.Batch
	b.Steps = steps
	b.Input, b.Target = b.Input[:steps*B], b.Target[:steps*B]
	for j := 0; j < B; j++ {
		col := l.tokens[(l.cfg.Rank*B+j)*l.rows:]
		for t := 0; t < steps; t++ {
			b.Input[t*B+j] = col[start+t]
			b.Target[t*B+j] = col[start+t+1]
		}
	}
	return b, nil
}
