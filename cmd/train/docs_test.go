package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoFiles returns the repository's files (relative to its root) whose
// names end with one of exts, without test files, testdata and hidden
// folders.
func repoFiles(t *testing.T, root string, exts ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "runs" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		for _, e := range exts {
			if !d.IsDir() && strings.HasSuffix(p, e) && !strings.HasSuffix(p, "_test.go") {
				rel, _ := filepath.Rel(root, p)
				out = append(out, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// outside matches a pointer into the developers' folder beside the
// repository (its data folder, where users are told their data may live,
// is not one).
var outside = regexp.MustCompile(`shared/(notes|DESIGN|papers|hooks|README)`)

// conflictMarker matches the lines git leaves in a file whose merge
// conflicted (a Markdown page still renders with them).
var conflictMarker = regexp.MustCompile(`(?m)^(<{7}|={7}|>{7})( .*)?$`)

// TestDocsStandAlone: the repository's documents and doc comments point
// only into the repository: no README, docs/ page or Go comment names the
// developers' notes beside it (which a clone does not have) or holds a
// merge's conflict marker, every relative
// link of a Markdown page names an existing file, and every section of the
// reference notes a reducer cites ("reference notes 7.4", "notes section 2")
// is a heading of docs/reference-behaviour.md.
func TestDocsStandAlone(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range repoFiles(t, root, ".md", ".go") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := outside.Find(b); m != nil {
			t.Errorf("%s points outside the repository: %q", f, m)
		}
		if m := conflictMarker.Find(b); m != nil {
			t.Errorf("%s holds a merge's conflict marker: %q", f, m)
		}
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for _, f := range repoFiles(t, root, ".md") {
		b, _ := os.ReadFile(filepath.Join(root, f))
		for _, m := range link.FindAllSubmatch(b, -1) {
			target := string(m[1])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.Dir(f), target)); err != nil {
				t.Errorf("%s links to %s, which is not in the repository", f, target)
			}
		}
	}
	notes, err := os.ReadFile(filepath.Join(root, "docs", "reference-behaviour.md"))
	if err != nil {
		t.Fatal(err)
	}
	heading := regexp.MustCompile(`(?m)^#{2,3} (\d+(?:\.\d+)?)[. ]`)
	sections := map[string]bool{}
	for _, m := range heading.FindAllSubmatch(notes, -1) {
		sections[string(m[1])] = true
	}
	cite := regexp.MustCompile(`notes(?: section)? (\d+(?:\.\d+)?)`)
	n := 0
	for _, f := range repoFiles(t, root, ".go") {
		b, _ := os.ReadFile(filepath.Join(root, f))
		for _, m := range cite.FindAllSubmatch(b, -1) {
			n++
			if !sections[string(m[1])] {
				t.Errorf("%s cites reference notes %s, which docs/reference-behaviour.md has no section for", f, m[1])
			}
		}
	}
	if n < 20 {
		t.Errorf("found only %d citations of the reference notes", n)
	}
	for _, f := range []string{"README.md", filepath.Join("sparsify", "doc.go")} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		if !strings.Contains(string(b), "docs/reference-behaviour.md") && !strings.Contains(string(b), "docs/design.md") {
			t.Errorf("%s names neither docs/design.md nor docs/reference-behaviour.md", f)
		}
	}
}

// TestREADMEStatesGPUResults is a regression test: after the first GPU run
// the README still said the GPU path had run "not yet on a GPU". It must
// link every GPU measurement document of docs/bench and docs/results (so
// that what was measured, and what is still to be measured, is one click
// away) and never claim the GPU path is unrun while such a document exists.
func TestREADMEStatesGPUResults(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, dir := range []string{"docs/bench", "docs/results"} {
		m, err := filepath.Glob(filepath.Join(root, dir, "gpu*.md"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			docs = append(docs, filepath.ToSlash(rel))
		}
	}
	if len(docs) == 0 {
		t.Fatal("no docs/bench/gpu*.md or docs/results/gpu*.md: the test's search is broken")
	}
	for _, d := range docs {
		if !strings.Contains(string(readme), "("+d+")") {
			t.Errorf("README does not link %s", d)
		}
	}
	if regexp.MustCompile(`(?i)not yet on a GPU|never (run|ran) on a GPU`).Match(readme) {
		t.Error("README says the GPU path has not run on a GPU, but GPU results are recorded")
	}
}
