package main

import (
	"os"
	"path/filepath"
	"strings"
)

// progName is the train command as the person ran it, for the commands its
// messages tell them to type next (the resume command) and for run.json:
// "bin/train" when they ran bin/train (a bare "train" is not on their PATH),
// "go run ./cmd/train" when they ran it with go run (whose binary lives in a
// temporary folder that is gone by then), else "train".
func progName() string {
	return progNameOf(os.Args[0], func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.IsDir()
	})
}

// progNameOf is progName for the program path arg0 (os.Args[0]); isDir
// reports whether a folder exists (relative to the current one).
func progNameOf(arg0 string, isDir func(string) bool) string {
	if filepath.Base(arg0) != "train" {
		return "train" // a test binary, or a renamed copy
	}
	if strings.Contains(filepath.ToSlash(arg0), "/go-build") {
		// go run: the binary is in the build cache's temporary folder.
		if isDir(filepath.Join("cmd", "train")) {
			return "go run ./cmd/train"
		}
		return "train"
	}
	return arg0
}
