package data

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz targets check that no input makes a parser panic, hang or return
// data together with an error, and that what parses obeys the format.

func FuzzParseCIFAR(f *testing.F) {
	f.Add([]byte{3}, false)
	f.Add(append([]byte{9}, make([]byte, CIFARPixels)...), false)
	f.Add(append([]byte{19, 99}, make([]byte, CIFARPixels)...), true)
	f.Add(append([]byte{10}, make([]byte, CIFARPixels)...), false)
	f.Fuzz(func(t *testing.T, b []byte, c100 bool) {
		kind := CIFAR10
		if c100 {
			kind = CIFAR100
		}
		c, err := ParseCIFAR(bytes.NewReader(b), "fuzz", kind, int64(len(b)))
		if err != nil {
			if c != nil {
				t.Fatal("data and error")
			}
			return
		}
		if len(b) != c.Len()*kind.RecordSize() || len(c.Pixels) != c.Len()*CIFARPixels {
			t.Fatalf("%d bytes parsed as %d records", len(b), c.Len())
		}
		for _, l := range c.Labels {
			if l < 0 || int(l) >= kind.Classes() {
				t.Fatalf("label %d", l)
			}
		}
	})
}

func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(" \n = Valkyria Chronicles III = \n"))
	f.Add([]byte("a b\r\nc"))
	f.Add([]byte{0, 1, 2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v := NewVocab()
		ids, err := ParseTokens(bytes.NewReader(b), "fuzz", v, nil)
		if err != nil {
			if ids != nil {
				t.Fatal("data and error")
			}
			return
		}
		// One <eos> per line.
		lines := strings.Count(string(b), "\n")
		if len(b) > 0 && b[len(b)-1] != '\n' {
			lines++
		}
		eos, _ := v.ID(EOS)
		n := 0
		for _, id := range ids {
			if id < 0 || int(id) >= v.Len() {
				t.Fatalf("id %d outside vocabulary of %d", id, v.Len())
			}
			if id == eos {
				n++
			}
		}
		if n < lines {
			t.Fatalf("%d <eos> for %d lines", n, lines)
		}
	})
}

func FuzzParseRatings(f *testing.F) {
	f.Add([]byte("196\t242\t3\t881250949\n"), uint8(FormatUData))
	f.Add([]byte("1::1193::5::978300760\n"), uint8(FormatDat))
	f.Add([]byte("userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n"), uint8(FormatCSV))
	f.Add([]byte("0\t25\t5\t978824351\n"), uint8(FormatNCF))
	f.Add([]byte("1::2::3\n"), uint8(FormatDat))
	f.Fuzz(func(t *testing.T, b []byte, format uint8) {
		fm := RatingFormat(format%4 + 1)
		rs, err := ParseRatings(bytes.NewReader(b), "fuzz", fm)
		if err != nil {
			if rs != nil {
				t.Fatal("data and error")
			}
			return
		}
		for _, r := range rs {
			if r.User < 0 || r.Item < 0 || r.Time < 0 || !(r.Rating >= 0 && r.Rating <= 5) {
				t.Fatalf("bad rating %+v accepted", r)
			}
		}
		if len(rs) > 0 && len(rs) < 20 {
			// A valid set of ratings also builds (or cleanly refuses) an implicit data set.
			d, err := NewImplicit(rs, ImplicitConfig{EvalNegatives: 1})
			if err == nil && len(d.TestItem) != d.Users {
				t.Fatal("inconsistent split")
			}
		}
	})
}

func checkInside(t *testing.T, root string) {
	t.Helper()
	es, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Name() != "x" {
			t.Fatalf("extraction wrote %s outside its folder", e.Name())
		}
	}
}

func FuzzUntar(f *testing.F) {
	f.Add(makeTarGz(f, []entry{{"d/", ""}, {"d/a", "1"}}))
	f.Add(makeTarGz(f, []entry{{"../a", "1"}}))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, b []byte) {
		root := t.TempDir()
		_ = untar(bytes.NewReader(b), filepath.Join(root, "x"), 1<<20)
		checkInside(t, root)
	})
}

func FuzzUnzip(f *testing.F) {
	f.Add(makeZip(f, []entry{{"d/a", "1"}, {"d/b/", ""}}))
	f.Add(makeZip(f, []entry{{"..\\a", "1"}}))
	f.Add([]byte("PK\x03\x04"))
	f.Fuzz(func(t *testing.T, b []byte) {
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		root := t.TempDir()
		_ = unzip(zr, filepath.Join(root, "x"), 1<<20)
		checkInside(t, root)
	})
}
