package train

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/sparsegrad/sparsegrad/options"
	"github.com/sparsegrad/sparsegrad/rundir"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// resumeMayChange reports whether a resumed run may set the configuration
// key (run.json's) to another value than the run had (options.Option's
// Resume); every other key decides the training itself and must match.
func resumeMayChange(key string) bool {
	o, _ := options.Lookup(key)
	return o.Resume
}

// flagOf is the command-line flag of a run.json configuration key.
func flagOf(key string) string {
	if o, ok := options.Lookup(key); ok {
		return o.FlagName()
	}
	if name, ok := strings.CutPrefix(key, "method_options."); ok {
		for _, m := range sparsify.Methods() {
			if p, ok := m.Param(name); ok {
				return p.FlagName()
			}
		}
		return name
	}
	return strings.ReplaceAll(key, "_", "-")
}

// configMap flattens a configuration into run.json's keys, the method
// options as "method_options.NAME".
func configMap(c Config) (map[string]any, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if mo, ok := m["method_options"].(map[string]any); ok {
		for k, v := range mo {
			m["method_options."+k] = v
		}
	}
	delete(m, "method_options")
	return m, nil
}

// resumeConfig returns the configuration that continues the run in
// given.Resume: the configuration of its run.json, with the values of the
// keys the caller gave changed where a resumed run may change them
// (resumeMayChange). A given value that contradicts the run (another
// sparsifier, density, model, worker count, ...) is refused with what
// differs. set names the command-line flags that were given; nil means
// every key whose value in given is not zero (callers of Run). The run's
// worker count is run.json's "workers"; under mpirun (mpi) a run of one
// process per worker continues with Workers 1.
func resumeConfig(given Config, set map[string]bool, mpi bool) (Config, *RunInfo, error) {
	dir := given.Resume
	info := &RunInfo{}
	if err := rundir.ReadRun(dir, info); err != nil {
		return Config{}, nil, configError(err)
	}
	if given.Out != "" && filepath.Clean(given.Out) != filepath.Clean(dir) {
		return Config{}, nil, fmt.Errorf("%w: -out %s with -resume %s: a resumed run continues in its own folder; drop -out", ErrConfig, given.Out, dir)
	}
	saved := info.Config
	sm, err := configMap(saved)
	if err != nil {
		return Config{}, nil, err
	}
	gm, err := configMap(given)
	if err != nil {
		return Config{}, nil, err
	}
	// The run's worker count is its number of ranks.
	sm["workers"] = float64(info.Workers)
	gw, gwSet := given.Workers.Value(), given.Workers.IsSet()
	isSet := func(k string, v any) bool {
		if set != nil {
			return set[flagOf(k)]
		}
		return !zeroJSON(v)
	}
	onecycle := saved.LRSchedule == "onecycle"
	var diffs []string
	merged := saved
	for _, k := range slices.Sorted(maps.Keys(gm)) {
		v := gm[k]
		if k == "out" || k == "resume" || k == "workers" || !isSet(k, v) {
			continue
		}
		if reflect.DeepEqual(v, sm[k]) {
			continue
		}
		if resumeMayChange(k) && !(onecycle && (k == "steps" || k == "epochs")) {
			merged.Set(k, given.Get(k))
			continue
		}
		why := ""
		if onecycle && (k == "steps" || k == "epochs") {
			why = " (the one-cycle schedule spans the run's -epochs or -steps)"
		}
		diffs = append(diffs, fmt.Sprintf("-%s %s: the run has %s%s", flagOf(k), showJSON(v), showJSON(sm[k]), why))
	}
	if gwSet && (set == nil || set["workers"]) && gw != info.Workers && !(mpi && gw == 1) {
		diffs = append(diffs, fmt.Sprintf("-workers %d: the run has %d workers", gw, info.Workers))
	}
	if len(diffs) > 0 {
		return Config{}, nil, fmt.Errorf("%w: -resume %s continues the run as it was configured; these flags contradict its run.json:\n  %s\n(drop them to continue the run, or start a new run with -out)", ErrConfig, dir, strings.Join(diffs, "\n  "))
	}
	merged.Workers = Set(info.Workers)
	if mpi {
		merged.Workers = Set(1)
	}
	merged.Resume, merged.Out = dir, dir
	return merged, info, nil
}

// zeroJSON reports whether a decoded JSON value is its type's zero.
func zeroJSON(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case []any:
		return false // an empty list is a choice (e.g. no decay)
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// showJSON formats a decoded JSON value for a message.
func showJSON(v any) string {
	switch x := v.(type) {
	case nil:
		return "(none)"
	case string:
		return x
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// checkpointMismatch compares a checkpoint's configuration and worker
// count with the run's and says what differs (empty: nothing that
// matters).
func checkpointMismatch(ck *rundir.Checkpoint[Config], c Config, workers int) ([]string, error) {
	var diffs []string
	if ck.Workers != workers {
		diffs = append(diffs, fmt.Sprintf("workers: the checkpoint has %d, this run %d", ck.Workers, workers))
	}
	a, err := configMap(ck.Config)
	if err != nil {
		return nil, err
	}
	b, err := configMap(c)
	if err != nil {
		return nil, err
	}
	delete(a, "workers")
	delete(b, "workers")
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if k == "out" || k == "resume" || resumeMayChange(k) {
			continue
		}
		if !reflect.DeepEqual(a[k], b[k]) {
			diffs = append(diffs, fmt.Sprintf("-%s: the checkpoint has %s, this run %s", flagOf(k), showJSON(a[k]), showJSON(b[k])))
		}
	}
	return diffs, nil
}
