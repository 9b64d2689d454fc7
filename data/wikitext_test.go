package data

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// refTokens is the obvious tokenisation: split lines, split fields, add <eos>.
func refTokens(text string, vocab map[string]int32, words *[]string) []int32 {
	var ids []int32
	add := func(w string) {
		id, ok := vocab[w]
		if !ok {
			id = int32(len(*words))
			vocab[w] = id
			*words = append(*words, w)
		}
		ids = append(ids, id)
	}
	lines := strings.Split(text, "\n")
	if strings.HasSuffix(text, "\n") {
		lines = lines[:len(lines)-1]
	}
	for _, l := range lines {
		for _, w := range strings.Fields(l) {
			add(w)
		}
		add(EOS)
	}
	return ids
}

func randomText(r *rand.Rand, lines int) string {
	words := []string{"the", "a", "<unk>", "=", "@-@", "Valkyria", "é", "3", ",", "."}
	var b strings.Builder
	for i := 0; i < lines; i++ {
		n := r.IntN(8)
		for j := 0; j < n; j++ {
			b.WriteString(strings.Repeat(" ", r.IntN(3)))
			b.WriteString(words[r.IntN(len(words))])
		}
		if r.IntN(5) == 0 {
			b.WriteString(" \r")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestParseTokensMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, lines := range []int{1, 2, 5, 100} {
		for _, trailingNL := range []bool{true, false} {
			text := randomText(r, lines)
			if !trailingNL {
				text = strings.TrimSuffix(text, "\n") + " last"
			}
			v := NewVocab()
			got, err := ParseTokens(strings.NewReader(text), "mem", v, nil)
			if err != nil {
				t.Fatal(err)
			}
			refV, refW := map[string]int32{}, []string{}
			want := refTokens(text, refV, &refW)
			if !slices.Equal(got, want) || !slices.Equal(v.Words, refW) {
				t.Fatalf("lines=%d: got %v %v, want %v %v", lines, got, v.Words, want, refW)
			}
			for w, id := range refV {
				if g, ok := v.ID(w); !ok || g != id {
					t.Fatalf("ID(%q) = %d, %v; want %d", w, g, ok, id)
				}
			}
		}
	}
	// A line longer than the reader's buffer.
	long := strings.Repeat("word ", 40000) + "end\n"
	v := NewVocab()
	got, err := ParseTokens(strings.NewReader(long), "long", v, nil)
	if err != nil || len(got) != 40002 || v.Len() != 3 {
		t.Fatalf("long line: %d tokens, vocab %d, %v", len(got), v.Len(), err)
	}
}

func TestParseTokensBadInput(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"empty", "", "empty file"},
		{"binary", "ok line\n\x00\x01\x02\xff\n", "line 2 contains a NUL byte"},
		{"latin1", "caf\xe9\n", "line 1: not valid UTF-8"},
		{"noline", strings.Repeat("x", maxLineBytes+10), "longer than"},
	}
	for _, c := range cases {
		_, err := ParseTokens(strings.NewReader(c.text), c.name+".tokens", NewVocab(), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.name+".tokens") {
			t.Errorf("%s: %v, want an error naming the file and %q", c.name, err, c.want)
		}
	}
}

func TestLoadWikiText(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadWikiText(dir)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "wikitext2") {
		t.Fatalf("missing: %v", err)
	}
	putFile(t, filepath.Join(dir, "wikitext-2", "wiki.train.tokens"), []byte(" \n = A = \n b c\n"))
	putFile(t, filepath.Join(dir, "wikitext-2", "wiki.valid.tokens"), []byte("d b\n"))
	_, err = LoadWikiText(dir)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "wiki.test.tokens") {
		t.Fatalf("missing test split: %v", err)
	}
	putFile(t, filepath.Join(dir, "wikitext-2", "test.txt"), []byte("e\n"))
	w, err := LoadWikiText(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Vocabulary in order of first occurrence: <eos> = A b c d e.
	if want := []string{EOS, "=", "A", "b", "c", "d", "e"}; !slices.Equal(w.Vocab.Words, want) {
		t.Fatalf("vocab %v, want %v", w.Vocab.Words, want)
	}
	if !slices.Equal(w.Train, []int32{0, 1, 2, 1, 0, 3, 4, 0}) || !slices.Equal(w.Valid, []int32{5, 3, 0}) || !slices.Equal(w.Test, []int32{6, 0}) {
		t.Fatalf("streams %v %v %v", w.Train, w.Valid, w.Test)
	}
	putFile(t, filepath.Join(dir, "wikitext-2", "wiki.valid.tokens"), []byte{0x50, 0x4b, 0x03, 0x04, 0, 0})
	if _, err := LoadWikiText(filepath.Join(dir, "wikitext-2")); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Fatalf("binary valid file: %v", err)
	}
}

func TestBPTTMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, n := range []int{2, 3, 50, 1001} {
		tokens := make([]int32, n)
		for i := range tokens {
			tokens[i] = int32(r.IntN(1000))
		}
		for _, size := range sizes {
			for _, batch := range []int{1, 2, 3} {
				for _, bptt := range []int{1, 5, 30} {
					cols := batch * size
					rows := n / cols
					if rows < 2 {
						if _, err := NewBPTTLoader(tokens, BPTTConfig{Batch: batch, BPTT: bptt, Size: size}); err == nil {
							t.Fatalf("n=%d cols=%d: no error for too few tokens", n, cols)
						}
						continue
					}
					// Reference: the PyTorch batchify (column c = tokens[c*rows:(c+1)*rows])
					// and get_batch on the global batch.
					global := func(i, tt, c int) (int32, int32) {
						row := i*bptt + tt
						return tokens[c*rows+row], tokens[c*rows+row+1]
					}
					wantWindows := (rows - 1 + bptt - 1) / bptt
					for rank := 0; rank < size; rank++ {
						l, err := NewBPTTLoader(tokens, BPTTConfig{Batch: batch, BPTT: bptt, Rank: rank, Size: size})
						if err != nil {
							t.Fatal(err)
						}
						if l.Len() != wantWindows || l.Rows() != rows {
							t.Fatalf("windows %d rows %d, want %d %d", l.Len(), l.Rows(), wantWindows, rows)
						}
						steps := 0
						for i := 0; i < l.Len(); i++ {
							b, err := l.Batch(i)
							if err != nil {
								t.Fatal(err)
							}
							if want := min(bptt, rows-1-i*bptt); b.Steps != want {
								t.Fatalf("window %d: %d steps, want %d", i, b.Steps, want)
							}
							steps += b.Steps
							for tt := 0; tt < b.Steps; tt++ {
								for j := 0; j < batch; j++ {
									in, tg := global(i, tt, rank*batch+j)
									if b.Input[tt*batch+j] != in || b.Target[tt*batch+j] != tg {
										t.Fatalf("n=%d size=%d rank=%d window %d t=%d col %d differs", n, size, rank, i, tt, j)
									}
								}
							}
						}
						if steps != rows-1 {
							t.Fatalf("windows cover %d steps, want %d", steps, rows-1)
						}
						if _, err := l.Batch(l.Len()); err == nil {
							t.Fatal("window out of range: no error")
						}
					}
				}
			}
		}
	}
	for _, cfg := range []BPTTConfig{{Batch: 0, BPTT: 1, Size: 1}, {Batch: 1, BPTT: 0, Size: 1}, {Batch: 1, BPTT: 1, Size: 0}, {Batch: 1, BPTT: 1, Size: 2, Rank: 2}} {
		if _, err := NewBPTTLoader(make([]int32, 100), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

func TestBPTTAllocationFree(t *testing.T) {
	l, err := NewBPTTLoader(make([]int32, 10000), BPTTConfig{Batch: 32, BPTT: 30, Size: 2, Rank: 1})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	if a := testing.AllocsPerRun(20, func() { l.Batch(i % l.Len()); i++ }); a != 0 {
		t.Errorf("Batch allocates %v times, want 0", a)
	}
}

func TestRealWikiText2(t *testing.T) {
	dir := needReal(t, "wikitext-2")
	w, err := LoadWikiText(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Train) != 2088628 || len(w.Valid) != 217646 || len(w.Test) != 245569 {
		t.Errorf("tokens train %d valid %d test %d, want 2088628 217646 245569", len(w.Train), len(w.Valid), len(w.Test))
	}
	if w.Vocab.Len() != 33278 {
		t.Errorf("vocabulary %d words, want 33278", w.Vocab.Len())
	}
	// Also through the parent folder.
	if w2, err := LoadWikiText(realData); err != nil || len(w2.Train) != len(w.Train) {
		t.Errorf("LoadWikiText(parent): %v", err)
	}
	l, err := NewBPTTLoader(w.Train, BPTTConfig{Batch: 32, BPTT: 30, Rank: 3, Size: 16})
	if err != nil {
		t.Fatal(err)
	}
	if want := (2088628/512 - 1 + 29) / 30; l.Len() != want {
		t.Errorf("%d windows, want %d", l.Len(), want)
	}
}
