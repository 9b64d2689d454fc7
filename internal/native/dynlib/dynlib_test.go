package dynlib

import (
	"errors"
	"strings"
	"testing"
)

var errMissing = errors.New("test library not found")

func TestOpenNamesEveryFailure(t *testing.T) {
	lib := Library{Candidates: []string{"libnothere-1.so", "libnothere-2.so"}, Env: "DYNLIB_TEST_PATH", NotFound: errMissing, Install: "install it (apt-get install nothere)"}
	for _, c := range []struct {
		env  string
		want []string
	}{
		{"", []string{"libnothere-1.so, libnothere-2.so", "apt-get install nothere", "DYNLIB_TEST_PATH"}},
		{"/nonexistent/libx.so", []string{"tried /nonexistent/libx.so:", "DYNLIB_TEST_PATH"}},
	} {
		t.Setenv("DYNLIB_TEST_PATH", c.env)
		_, err := lib.Open(func(string, uintptr) error { t.Fatal("use called without a library"); return nil })
		if !errors.Is(err, errMissing) {
			t.Fatalf("env %q: %v does not wrap NotFound", c.env, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("env %q: %q does not say %q", c.env, err, w)
			}
		}
	}
}

// TestOpenAndBind opens the C library: use may refuse a candidate (the next
// is tried), Bind binds every symbol or, when one is missing, none.
func TestOpenAndBind(t *testing.T) {
	lib := Library{Candidates: []string{"libc.so.6", "libc.so.6"}, Env: "DYNLIB_TEST_PATH", NotFound: errMissing, Install: "?"}
	t.Setenv("DYNLIB_TEST_PATH", "")
	var strlen, abs func(int32) int32
	tries := 0
	path, err := lib.Open(func(p string, h uintptr) error {
		tries++
		if tries == 1 {
			return errors.New("refused")
		}
		if err := Bind(h, Symbol{"abs", &abs}, Symbol{"no_such_symbol_xyz", &strlen}); err == nil || !strings.Contains(err.Error(), "no_such_symbol_xyz") {
			t.Errorf("a missing symbol: %v", err)
		}
		if abs != nil {
			t.Error("a failed Bind bound abs")
		}
		return Bind(h, Symbol{"abs", &abs})
	})
	if err != nil {
		t.Fatalf("the C library (libc.so.6) did not open: %v", err)
	}
	if path != "libc.so.6" || tries != 2 {
		t.Fatalf("opened %q after %d tries", path, tries)
	}
	if got := abs(-7); got != 7 {
		t.Fatalf("abs(-7) = %d", got)
	}
}
