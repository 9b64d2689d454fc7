package mpi

import (
	"os"
	"strconv"
	"strings"
)

// Launch describes how this process was started by a parallel launcher.
type Launch struct {
	// Launcher names the environment the launch was read from: "openmpi",
	// "pmix", "pmi" or "slurm".
	Launcher string
	// Rank is this process's rank in the job; Size the number of processes,
	// or 0 where the launcher does not say (PMIx alone): MPI tells after Open.
	Rank, Size int
	// LocalRank is the rank among the processes on this node, -1 if unknown.
	LocalRank int
}

// Detect reports whether this process runs under an MPI launcher, reading the
// environment: Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), a
// PMIx server (PMIX_RANK, PMIX_LOCAL_RANK), a PMI launcher such as Hydra
// (PMI_RANK/PMI_SIZE, MPI_LOCALRANKID) or Slurm's srun
// (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID). Where srun started the process
// through PMI or PMIx (srun --mpi=pmi2 or pmix), which do not say the local
// rank, Slurm's SLURM_LOCALID gives it. The launchers other than mpirun
// also set their variables for programs that are not MPI jobs, so they
// count only when an MPI library can be loaded (see LibEnv). Detect loads
// nothing else and never initializes MPI.
func Detect() (Launch, bool) {
	l, ok, needLib := detectEnv(os.Getenv)
	if !ok {
		return Launch{}, false
	}
	if needLib && !libraryAvailable() {
		return Launch{}, false
	}
	return l, true
}

// detectEnv parses the launcher variables from getenv. needLib says that the
// variables alone do not prove an MPI job.
func detectEnv(getenv func(string) string) (l Launch, ok, needLib bool) {
	atoi := func(key string) (int, bool) {
		v := getenv(key)
		if v == "" {
			return 0, false
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, false
		}
		return n, true
	}
	local := func(key string) int {
		if n, ok := atoi(key); ok {
			return n
		}
		return -1
	}
	valid := func(l Launch) bool { return l.Size == 0 || l.Rank < l.Size }
	// The local rank Slurm gives where the launcher's own variable is
	// missing (PMI and PMIx under srun).
	orSlurm := func(l Launch) Launch {
		if l.LocalRank < 0 && srunStarted(l, getenv) {
			l.LocalRank = local("SLURM_LOCALID")
		}
		return l
	}
	if r, ok := atoi("OMPI_COMM_WORLD_RANK"); ok {
		s, _ := atoi("OMPI_COMM_WORLD_SIZE")
		l = Launch{Launcher: "openmpi", Rank: r, Size: s, LocalRank: local("OMPI_COMM_WORLD_LOCAL_RANK")}
		return l, valid(l), false
	}
	if r, ok := atoi("PMIX_RANK"); ok {
		l = Launch{Launcher: "pmix", Rank: r, LocalRank: local("PMIX_LOCAL_RANK")}
		if s, ok := atoi("PMIX_SIZE"); ok {
			l.Size = s
		}
		l = orSlurm(l)
		return l, valid(l), true
	}
	if r, ok := atoi("PMI_RANK"); ok {
		if s, ok := atoi("PMI_SIZE"); ok && s > 0 {
			l = orSlurm(Launch{Launcher: "pmi", Rank: r, Size: s, LocalRank: local("MPI_LOCALRANKID")})
			return l, valid(l), true
		}
	}
	if r, ok := atoi("SLURM_PROCID"); ok {
		if s, ok := atoi("SLURM_NTASKS"); ok && s > 0 {
			l = Launch{Launcher: "slurm", Rank: r, Size: s, LocalRank: local("SLURM_LOCALID")}
			return l, valid(l), true
		}
	}
	return Launch{}, false, false
}

// srunStarted reports whether Slurm's srun started this process as rank
// l.Rank of l.Size (of a size it does not say, for PMIx): its task id and
// count are the launcher's. A process that merely inherited Slurm's
// variables (a launcher's daemon started by srun, one per node) has the
// daemon's.
func srunStarted(l Launch, getenv func(string) string) bool {
	id, err := strconv.Atoi(getenv("SLURM_PROCID"))
	if err != nil || id != l.Rank {
		return false
	}
	n, err := strconv.Atoi(getenv("SLURM_NTASKS"))
	return err == nil && n > l.Rank && (l.Size == 0 || n == l.Size)
}

// LocalSize is the number of the job's processes on this node, read from
// the launcher's environment (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE,
// PMIx's PMIX_LOCAL_SIZE, Hydra's MPI_LOCALNRANKS, Slurm's
// SLURM_TASKS_PER_NODE at SLURM_NODEID, also for PMI and PMIx under srun),
// or -1 where it does not say.
func (l Launch) LocalSize() int { return localSize(l, os.Getenv) }

func localSize(l Launch, getenv func(string) string) int {
	n := -1
	switch l.Launcher {
	case "openmpi":
		return positive(getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
	case "pmix":
		n = positive(getenv("PMIX_LOCAL_SIZE"))
	case "pmi":
		n = positive(getenv("MPI_LOCALNRANKS"))
	case "slurm":
		return slurmLocalSize(getenv)
	}
	if n < 0 && srunStarted(l, getenv) {
		return slurmLocalSize(getenv)
	}
	return n
}

// positive is v as a positive number, else -1.
func positive(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return -1
	}
	return n
}

// slurmLocalSize is the number of tasks on this node from
// SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of the first three
// nodes, 1 on the fourth) at SLURM_NODEID, or -1.
func slurmLocalSize(getenv func(string) string) int {
	node, err := strconv.Atoi(getenv("SLURM_NODEID"))
	if err != nil || node < 0 {
		node = 0
	}
	for _, part := range strings.Split(getenv("SLURM_TASKS_PER_NODE"), ",") {
		tasks, reps, ok := strings.Cut(part, "(x")
		r := 1
		if ok {
			if r = positive(strings.TrimSuffix(reps, ")")); r < 0 {
				return -1
			}
		}
		if node < r {
			return positive(tasks)
		}
		node -= r
	}
	return -1
}

// libraryAvailable reports whether an MPI library can be loaded.
func libraryAvailable() bool {
	_, err := loadLib("")
	return err == nil
}
