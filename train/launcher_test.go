package train

import "testing"

func TestLauncherPrefix(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		prog string
		want string // "" not found
	}{
		{[]string{"mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", "bin/train", "-model", "ncf"}, "bin/train", "mpirun --oversubscribe --allow-run-as-root -np 4"},
		{[]string{"/usr/bin/mpiexec", "-n", "2", "-x", "A=b c", "--host", "h1,h2", "/opt/x/train", "-resume", "r"}, "/opt/x/train", "/usr/bin/mpiexec -n 2 -x 'A=b c' --host h1,h2"},
		{[]string{"mpirun", "-np", "2", "--mca", "btl", "^openib", "it's/train"}, "it's/train", "mpirun -np 2 --mca btl ^openib"},
		{[]string{"orterun", "-np", "2", "train"}, "train", "orterun -np 2"},
		{[]string{"bash", "-c", "train"}, "train", ""},             // not a launcher
		{[]string{"mpirun", "-np", "2", "other"}, "bin/train", ""}, // not this program
		{[]string{"mpirun"}, "train", ""},
	} {
		got, ok := launcherPrefix(tc.argv, tc.prog)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.argv, got, ok, tc.want)
		}
	}
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		root bool
		env  map[string]string
		want string
	}{
		{false, nil, "mpirun -np 3"},
		{true, nil, "mpirun --allow-run-as-root -np 3"},
		{true, map[string]string{"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}, "mpirun -np 3"},
		{false, map[string]string{"OMPI_MCA_rmaps_base_oversubscribe": "1"}, "mpirun --oversubscribe -np 3"},
		{true, map[string]string{"OMPI_MCA_rmaps_base_oversubscribe": "1"}, "mpirun --oversubscribe --allow-run-as-root -np 3"},
	} {
		if got := fallbackLauncher(3, tc.root, env(tc.env)); got != tc.want {
			t.Errorf("root %v, %v: %q, want %q", tc.root, tc.env, got, tc.want)
		}
	}
	if got := shellQuote(""); got != "''" {
		t.Errorf("shellQuote(\"\") = %q", got)
	}
}
