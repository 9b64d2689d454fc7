package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// readmeCommands returns the commands of README.md's code blocks, one per
// command, continuation lines ("\" at the end) joined.
func readmeCommands(readme string) []string {
	var cmds []string
	in := false
	cur := ""
	sc := bufio.NewScanner(strings.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			cur = ""
			continue
		}
		if !in {
			continue
		}
		t := strings.TrimSpace(line)
		if strings.HasSuffix(t, `\`) {
			cur += strings.TrimSpace(strings.TrimSuffix(t, `\`)) + " "
			continue
		}
		cur += t
		if strings.TrimSpace(cur) != "" {
			cmds = append(cmds, strings.TrimSpace(cur))
		}
		cur = ""
	}
	return cmds
}

func TestReadmeCommandsExtraction(t *testing.T) {
	md := "text\n```\ngo run ./cmd/train -a \\\n    -b 1 -out x\n\nbin/train -help   # comment\n```\nmore `inline`\n```\nmpirun -np 4 \\\n  bin/train\n```\n"
	want := []string{"go run ./cmd/train -a -b 1 -out x", "bin/train -help   # comment", "mpirun -np 4 bin/train"}
	if got := readmeCommands(md); !slices.Equal(got, want) {
		t.Fatalf("readmeCommands = %q, want %q", got, want)
	}
}

// TestREADMECommands runs the README's main command, the build of
// bin/train and its mpirun line exactly as written, in a fresh clone of
// the repository next to a folder shared/ holding the real data (the
// README's ../shared/data), and checks what they promise: the main run
// ends by naming its report, the mpirun job of 4 processes writes a run
// with the same per-step losses as the main command's 4 simulated workers.
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository, compiles it and trains twice (about 3 minutes on 2 cores)")
	}
	data := testenv.SharedData(t, "ml-100k/u.data")
	testenv.Tool(t, testenv.Git, "git", "install git (apt-get install git)")
	testenv.MPIRun(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	clone := filepath.Join(base, "sparsegrad")
	if b, err := testenv.Command(t, 5*time.Minute, "git", "clone", "--quiet", "--no-hardlinks", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, b)
	}
	if err := os.Symlink(filepath.Dir(data), filepath.Join(base, "shared")); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(clone, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(string(readme))
	find := func(prefix string) string {
		t.Helper()
		for _, c := range cmds {
			if strings.HasPrefix(c, prefix) {
				return c
			}
		}
		t.Fatalf("README.md has no command starting with %q", prefix)
		return ""
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, mainEnv+"=") || strings.HasPrefix(kv, "TRAIN_DATA_DIR=")
	})
	run := func(cmd string) string {
		t.Helper()
		c := testenv.Command(t, 10*time.Minute, "bash", "-c", cmd)
		c.Dir, c.Env = clone, env
		start := time.Now()
		out, err := c.CombinedOutput()
		t.Logf("%s\n  took %v", cmd, time.Since(start).Round(100*time.Millisecond))
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return string(out)
	}

	out := run(find("go run ./cmd/train"))
	ls := lines(out)
	if len(ls) == 0 || !strings.HasPrefix(ls[len(ls)-1], "report: runs/ncf-deft/report.html") {
		t.Errorf("the main command does not end by naming its report:\n%s", out)
	}
	run(find("go build -o bin/train"))
	run(find("mpirun "))
	for _, dir := range []string{"ncf-deft", "ncf-mpi"} {
		if _, err := os.Stat(filepath.Join(clone, "runs", dir, "report.html")); err != nil {
			t.Errorf("runs/%s: %v", dir, err)
		}
	}
	var info struct {
		Backend string `json:"backend"`
		Workers int    `json:"workers"`
	}
	b, err := os.ReadFile(filepath.Join(clone, "runs", "ncf-mpi", "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &info); err != nil || info.Backend != "mpi" || info.Workers != 4 {
		t.Errorf("the mpirun job's run.json: %+v (%v), want 4 workers over mpi", info, err)
	}
	a, m := losses(t, filepath.Join(clone, "runs", "ncf-deft")), losses(t, filepath.Join(clone, "runs", "ncf-mpi"))
	if len(a) == 0 || !slices.Equal(a, m) {
		t.Errorf("the mpirun job's %d losses differ from the main command's %d", len(m), len(a))
	}
}

// TestREADMEOutputsIgnored is a regression test: the README's commands left
// grads/, sweeps/ and r18-here.json in the working tree, which .gitignore
// did not cover, so that a user who followed it saw them as new files.
// Every path a README command writes (-out, -measurements,
// -record-gradients) must be ignored by git.
func TestREADMEOutputsIgnored(t *testing.T) {
	git := testenv.Tool(t, testenv.Git, "git", "install git")
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range readmeCommands(string(readme)) {
		f := strings.Fields(c)
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "-out", "-measurements", "-record-gradients":
				paths = append(paths, f[i+1])
			}
		}
	}
	if len(paths) < 5 {
		t.Fatalf("found only %d output paths in README's commands (%v): the extraction is broken", len(paths), paths)
	}
	for _, p := range paths {
		cmd := testenv.Command(t, time.Minute, git, "-C", root, "check-ignore", "-q", "--no-index", p)
		if err := cmd.Run(); err != nil {
			t.Errorf("README writes %s, which .gitignore does not ignore (git check-ignore: %v)", p, err)
		}
	}
}

// TestREADMESparsifiersHaveWorkers is a regression test: the README's LSTM
// example ran MiCRO with one worker, which sends nothing (its bytes chart
// was empty), so it showed nothing of what it was for. Every README command
// that trains with a sparsifier other than dense runs at least two workers:
// -workers N ≥ 2, or mpirun -np N ≥ 2.
func TestREADMESparsifiersHaveWorkers(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, c := range readmeCommands(string(readme)) {
		f := strings.Fields(strings.SplitN(c, "#", 2)[0])
		train := slices.ContainsFunc(f, func(s string) bool { return s == "bin/train" || s == "./cmd/train" })
		if !train || slices.Contains(f, "sweep") || slices.Contains(f, "advise") || slices.Contains(f, "replay") || slices.Contains(f, "report") {
			continue
		}
		i := slices.Index(f, "-sparsifier")
		if i < 0 || i+1 >= len(f) || f[i+1] == "dense" {
			continue
		}
		checked++
		workers := 1
		for j := 0; j+1 < len(f); j++ {
			if f[j] == "-workers" || (f[0] == "mpirun" && f[j] == "-np") {
				if n, err := strconv.Atoi(f[j+1]); err == nil {
					workers = n
				}
			}
		}
		if workers < 2 {
			t.Errorf("README runs -sparsifier %s with one worker, which sends nothing: %s", f[i+1], c)
		}
	}
	if checked < 3 {
		t.Fatalf("checked only %d README commands: the extraction is broken", checked)
	}
}
