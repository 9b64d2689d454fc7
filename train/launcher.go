package train

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// mpiLauncher is how the commands this job prints start it again under
// mpirun, up to the program: mpirun's own command line as the person typed
// it (-np, --oversubscribe, --allow-run-as-root, --host, -x, ...), read from
// the parent process (Open MPI starts the ranks of the machine it runs on as
// its children); where that cannot be read (another launcher, a rank on
// another machine), "mpirun -np N" with the flags the environment shows
// (fallbackLauncher). A resume command without --allow-run-as-root fails as
// root, one without --oversubscribe on a machine with fewer cores than
// ranks.
func mpiLauncher(size int) string {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid())); err == nil {
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if p, ok := launcherPrefix(argv, os.Args[0]); ok {
			return p
		}
	}
	return fallbackLauncher(size, os.Geteuid() == 0, os.Getenv)
}

// launcherPrefix returns the part of mpirun's command line argv before the
// program prog, shell-quoted; ok is false when argv is not mpirun's (or
// mpiexec's, orterun's, prterun's) or does not hold prog.
func launcherPrefix(argv []string, prog string) (string, bool) {
	if len(argv) < 2 {
		return "", false
	}
	switch filepath.Base(argv[0]) {
	case "mpirun", "mpiexec", "orterun", "prterun":
	default:
		return "", false
	}
	for i := 1; i < len(argv); i++ {
		if argv[i] == prog {
			q := make([]string, i)
			for j, a := range argv[:i] {
				q[j] = shellQuote(a)
			}
			return strings.Join(q, " "), true
		}
	}
	return "", false
}

// fallbackLauncher is "mpirun -np size" with the flags Open MPI's
// environment shows the job was started with: --oversubscribe (Open MPI 4
// sets OMPI_MCA_rmaps_base_oversubscribe=1 for it), and, for root (which
// mpirun refuses without it or the two OMPI_ALLOW_RUN_AS_ROOT variables),
// --allow-run-as-root.
func fallbackLauncher(size int, root bool, getenv func(string) string) string {
	parts := []string{"mpirun"}
	if getenv("OMPI_MCA_rmaps_base_oversubscribe") == "1" {
		parts = append(parts, "--oversubscribe")
	}
	if root && !(getenv("OMPI_ALLOW_RUN_AS_ROOT") == "1" && getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1") {
		parts = append(parts, "--allow-run-as-root")
	}
	return strings.Join(append(parts, "-np", strconv.Itoa(size)), " ")
}

// plainWord matches the words a shell takes as they are.
var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./:=,+@%^-]+$`)

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
