package mpi

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

func TestDetectEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Launch
		ok      bool
		needLib bool
	}{
		{"none", nil, Launch{}, false, false},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
			Launch{"openmpi", 2, 4, 0}, true, false},
		{"openmpi no local", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
			Launch{"openmpi", 0, 1, -1}, true, false},
		{"openmpi rank beyond size", map[string]string{"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, Launch{"openmpi", 4, 4, -1}, false, false},
		{"openmpi wins over slurm", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "8"},
			Launch{"openmpi", 1, 2, -1}, true, false},
		{"pmix", map[string]string{"PMIX_RANK": "3"}, Launch{"pmix", 3, 0, -1}, true, true},
		{"pmi", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "3"}, Launch{"pmi", 1, 3, -1}, true, true},
		{"pmi without size", map[string]string{"PMI_RANK": "1"}, Launch{}, false, false},
		{"slurm", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1"}, Launch{"slurm", 5, 6, 1}, true, true},
		{"slurm garbage", map[string]string{"SLURM_PROCID": "x", "SLURM_NTASKS": "6"}, Launch{}, false, false},
		{"pmix local rank", map[string]string{"PMIX_RANK": "3", "PMIX_LOCAL_RANK": "2"}, Launch{"pmix", 3, 0, 2}, true, true},
		{"hydra local rank", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1"}, Launch{"pmi", 1, 3, 1}, true, true},
		// srun --mpi=pmi2 and --mpi=pmix set no local rank of their own:
		// Slurm's is the process's (else every rank would use GPU 0).
		{"pmi under srun", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"},
			Launch{"pmi", 3, 4, 1}, true, true},
		{"pmix under srun", map[string]string{"PMIX_RANK": "2", "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"},
			Launch{"pmix", 2, 0, 0}, true, true},
		{"pmi's own local rank first", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"},
			Launch{"pmi", 3, 4, 0}, true, true},
		// Hydra's ranks under a proxy srun started (one per node) inherit
		// the proxy's task id: not theirs.
		{"pmi under a proxy of srun", map[string]string{"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
			Launch{"pmi", 5, 8, -1}, true, true},
		{"pmi, srun's count differs", map[string]string{"PMI_RANK": "1", "PMI_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
			Launch{"pmi", 1, 8, -1}, true, true},
		{"negative rank", map[string]string{"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, Launch{}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, needLib := detectEnv(func(k string) string { return tc.env[k] })
			if ok != tc.ok || (ok && (got != tc.want || needLib != tc.needLib)) {
				t.Fatalf("detectEnv = %+v, %v, %v; want %+v, %v, %v", got, ok, needLib, tc.want, tc.ok, tc.needLib)
			}
		})
	}
}

func FuzzDetectEnv(f *testing.F) {
	f.Add("3", "4", "", "")
	f.Add("", "", "1", "2")
	f.Add("x", "-1", "99999999999999999999", "0")
	f.Fuzz(func(t *testing.T, ompiRank, ompiSize, slurmID, slurmN string) {
		env := map[string]string{"OMPI_COMM_WORLD_RANK": ompiRank, "OMPI_COMM_WORLD_SIZE": ompiSize, "SLURM_PROCID": slurmID, "SLURM_NTASKS": slurmN}
		l, ok, _ := detectEnv(func(k string) string { return env[k] })
		if ok && (l.Rank < 0 || l.Size < 0 || (l.Size > 0 && l.Rank >= l.Size)) {
			t.Fatalf("accepted an impossible launch %+v", l)
		}
	})
}

func TestLoadLibMissing(t *testing.T) {
	_, err := loadLib("/nonexistent/libmpi.so.40")
	if !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("err = %v, want ErrNoLibrary", err)
	}
	for _, want := range []string{"apt-get install openmpi-bin", LibEnv, "/nonexistent/libmpi.so.40"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// A library that exists but is not Open MPI.
	if _, err := loadLib("libc.so.6"); !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), "not an Open MPI") {
		t.Errorf("loading libc as MPI: err = %v, want a 'not an Open MPI' error", err)
	}
}

func TestAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 8, 9, 63, 1000} {
		a, b := make(comm.Float32s, n), make(comm.Float32s, n)
		ia, ib := make(comm.Int64s, n), make(comm.Int64s, n)
		ja, jb := make(comm.Int32s, n), make(comm.Int32s, n)
		for i := range a {
			a[i], b[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*1e3)
			ia[i], ib[i] = rng.Int64(), rng.Int64()
			ja[i], jb[i] = rng.Int32(), -rng.Int32()
		}
		dst := make(comm.Float32s, n)
		add(comm.Float32, dst.Bytes(), a.Bytes(), b.Bytes())
		for i := range dst {
			if dst[i] != a[i]+b[i] {
				t.Fatalf("n=%d: float dst[%d] = %v, want %v", n, i, dst[i], a[i]+b[i])
			}
		}
		want := make(comm.Int64s, n)
		for i := range want {
			want[i] = ia[i] + ib[i]
		}
		add(comm.Int64, ib.Bytes(), ia.Bytes(), ib.Bytes()) // in place
		for i := range want {
			if ib[i] != want[i] {
				t.Fatalf("n=%d: int64 [%d] = %v, want %v", n, i, ib[i], want[i])
			}
		}
		want32 := make(comm.Int32s, n)
		for i := range want32 {
			want32[i] = ja[i] + jb[i]
		}
		add(comm.Int32, jb.Bytes(), ja.Bytes(), jb.Bytes())
		for i := range want32 {
			if jb[i] != want32[i] {
				t.Fatalf("n=%d: int32 [%d] = %v, want %v", n, i, jb[i], want32[i])
			}
		}
	}
}

// TestRingSchedule checks the ring's block schedule against the canonical
// order: following the messages, block j must be accumulated by ranks j+1,
// …, j and then forwarded to everybody.
func TestRingSchedule(t *testing.T) {
	for _, n := range []int{2, 3, 5, 16} {
		ops := make([]*ringOp, n)
		for r := range ops {
			ops[r] = &ringOp{n: n, r: r}
		}
		// order[j] lists the ranks whose values block j has accumulated,
		// as seen by the rank holding the partial sum.
		for j := 0; j < n; j++ {
			holder, order := mod(j+1, n), []int{mod(j+1, n)}
			for t0 := 0; t0 < n-1; t0++ {
				o := ops[holder]
				if o.sendBlock(t0) != j {
					t.Fatalf("n=%d: rank %d sends block %d at step %d, want %d", n, holder, o.sendBlock(t0), t0, j)
				}
				next := mod(holder+1, n)
				if ops[next].recvBlock(t0) != j {
					t.Fatalf("n=%d: rank %d receives block %d at step %d, want %d", n, next, ops[next].recvBlock(t0), t0, j)
				}
				holder = next
				order = append(order, holder)
			}
			if holder != j {
				t.Fatalf("n=%d: block %d ends at rank %d", n, j, holder)
			}
			for k, r := range order {
				if r != mod(j+1+k, n) {
					t.Fatalf("n=%d: block %d order %v is not canonical", n, j, order)
				}
			}
			// All-gather: block j travels j → j+1 → … → j−1.
			for u := 0; u < n-1; u++ {
				if ops[holder].sendBlock(n-1+u) != j || ops[mod(holder+1, n)].recvBlock(n-1+u) != j {
					t.Fatalf("n=%d: all-gather step %d does not forward block %d from rank %d", n, u, j, holder)
				}
				holder = mod(holder+1, n)
			}
		}
	}
}

func TestLibEnvOverride(t *testing.T) {
	t.Setenv(LibEnv, "/nonexistent/dir/libmpi-custom.so")
	_, err := loadLib("")
	if !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), "libmpi-custom.so") {
		t.Fatalf("with %s set to a missing file: err = %v, want ErrNoLibrary naming the file", LibEnv, err)
	}
	if libraryAvailable() {
		t.Errorf("libraryAvailable() = true although %s names a missing file", LibEnv)
	}
	if _, ok := Detect(); ok && os.Getenv("OMPI_COMM_WORLD_RANK") == "" {
		t.Errorf("Detect found a launch with no launcher variables set")
	}
	// The override also finds a real library (where Open MPI is installed).
	t.Setenv(LibEnv, "")
	if _, err := loadLib(""); err != nil {
		testenv.Missing(t, testenv.MPI, fmt.Sprintf("no Open MPI library here (%v); the rest needs one (apt-get install openmpi-bin)", err))
	}
	l, err := loadLib("")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(LibEnv, l.path)
	if _, err := loadLib(""); err != nil {
		t.Fatalf("with %s=%s: %v", LibEnv, l.path, err)
	}
}

func TestLocalSize(t *testing.T) {
	for _, tc := range []struct {
		launcher string
		env      map[string]string
		want     int
	}{
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4},
		{"openmpi", nil, -1},
		{"pmix", map[string]string{"PMIX_LOCAL_SIZE": "8"}, 8},
		{"pmi", map[string]string{"MPI_LOCALNRANKS": "2"}, 2},
		{"pmi", map[string]string{"MPI_LOCALNRANKS": "x"}, -1},
		{"slurm", map[string]string{"SLURM_TASKS_PER_NODE": "4"}, 4},
		{"slurm", map[string]string{"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2"}, 2},
		{"slurm", map[string]string{"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1},
		{"slurm", map[string]string{"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "4"}, -1},
		{"slurm", map[string]string{"SLURM_TASKS_PER_NODE": "2(xq)"}, -1},
		{"slurm", nil, -1},
		// PMI and PMIx under srun (rank 1 of 4 in both): Slurm's count.
		{"pmi", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)"}, 2},
		{"pmix", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "3,1"}, 3},
		{"pmi", map[string]string{"MPI_LOCALNRANKS": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)"}, 1},
		// Slurm's variables of another process (a proxy's): not used.
		{"pmi", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)"}, -1},
	} {
		l := Launch{Launcher: tc.launcher, Rank: 1, Size: 4, LocalRank: -1}
		if tc.launcher == "pmix" {
			l.Size = 0
		}
		if got := localSize(l, func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("%s %v: local size %d, want %d", tc.launcher, tc.env, got, tc.want)
		}
	}
}
