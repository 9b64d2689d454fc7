//go:build linux

package train

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/smalldisk"
	"github.com/sparsegrad/sparsegrad/rundir"
)

// TestFullDiskStopsTheRun runs on a real file system that fills up (a
// 3 MiB tmpfs): the first checkpoint fits, the second does not (an NCF
// checkpoint of ml-100k is 1.7 MB with one worker, 2.2 MB with two). The
// run stops at that checkpoint with a non-zero result naming the steps
// lost, the disk's error and the checkpoint to resume from; that
// checkpoint is intact: the run resumes from it elsewhere and completes.
func TestFullDiskStopsTheRun(t *testing.T) {
	for _, workers := range []int{1, 2} {
		disk := smalldisk.Mount(t, 3<<20)
		c := ncfConfig(t, workers, 8)
		c.Out, c.CheckpointEvery, c.Quiet = filepath.Join(disk, "run"), 2, false
		var out bytes.Buffer
		err := Run(context.Background(), c, Options{Stdout: &out, Progress: &out})
		want := `^train: stopped after step 4: its checkpoint was not written: .*no space left on device; steps 3 to 4 are lost; the last checkpoint is ` +
			regexp.QuoteMeta(rundir.CheckpointDir(c.Out, 2)) + ` \(step 2\); make room on the disk \(or fix the folder\), then resume with: train -resume ` + regexp.QuoteMeta(c.Out) + `$`
		if err == nil || !regexp.MustCompile(want).MatchString(err.Error()) {
			t.Fatalf("%d workers: err %v\nwant %s\noutput:\n%s", workers, err, want, out.String())
		}
		if _, err := os.Stat(rundir.CheckpointDir(c.Out, 4)); err == nil {
			t.Errorf("%d workers: the failed checkpoint's folder was left", workers)
		}
		if got, _ := rundir.Latest(c.Out); got != rundir.CheckpointDir(c.Out, 2) {
			t.Fatalf("%d workers: newest checkpoint %s, want step 2's", workers, got)
		}
		// The checkpoint of step 2 continues the run (on a disk with room).
		moved := filepath.Join(t.TempDir(), "run")
		if err := os.CopyFS(moved, os.DirFS(c.Out)); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		if err := Run(context.Background(), Config{Resume: moved, Quiet: false}, Options{Stdout: &out, Progress: &out, Given: map[string]bool{"quiet": true}}); err != nil {
			t.Fatalf("%d workers: resuming the copy: %v", workers, err)
		}
		if !strings.Contains(out.String(), "resuming from "+rundir.CheckpointDir(moved, 2)+" (step 2") {
			t.Errorf("%d workers: the resume did not start at step 2:\n%s", workers, out.String())
		}
		if got, _ := rundir.Latest(moved); got != rundir.CheckpointDir(moved, 8) {
			t.Fatalf("%d workers: after the resume the newest checkpoint is %s, want step 8's", workers, got)
		}
	}
}
