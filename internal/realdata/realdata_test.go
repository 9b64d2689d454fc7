package realdata

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf and stops the
// function under test as they would.
type recorder struct {
	testing.TB
	fatal, skip string
}

type stop struct{}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(stop{})
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(stop{})
}

// call runs Dir with a recorder and reports what it did.
func call(t *testing.T, dir string, probes ...string) (r *recorder, got string) {
	r = &recorder{TB: t}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stop); !ok {
				panic(p)
			}
		}
	}()
	return r, Dir(r, dir, probes...)
}

func TestDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "ml-100k"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ml-100k", "u.data"), []byte("1\t1\t5\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		env    string
		probes []string
		want   string // "ok", "skip" or "fatal"
		says   string // part of the message
	}{
		{"present", "", []string{"ml-100k/u.data"}, "ok", ""},
		{"present, required", Require, []string{"ml-100k/u.data"}, "ok", ""},
		{"missing skips by default", "", []string{"ml-100k/u.data", "cifar-10-batches-bin/data_batch_1.bin"}, "skip", "data_batch_1.bin"},
		{"missing fails when required", Require, []string{"cifar-10-batches-bin/data_batch_1.bin"}, "fatal", "data_batch_1.bin"},
		{"a typo in the switch fails", "requried", []string{"ml-100k/u.data"}, "fatal", "not a valid setting"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(Env, tc.env)
			r, got := call(t, dir, tc.probes...)
			what, msg := "ok", ""
			switch {
			case r.fatal != "":
				what, msg = "fatal", r.fatal
			case r.skip != "":
				what, msg = "skip", r.skip
			}
			if what != tc.want || !strings.Contains(msg, tc.says) {
				t.Fatalf("%s with %s=%q: %s %q, want %s naming %q", tc.probes, Env, tc.env, what, msg, tc.want, tc.says)
			}
			if what == "ok" && got != dir {
				t.Fatalf("Dir returned %q, want %q", got, dir)
			}
		})
	}
}
