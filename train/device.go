package train

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/engine"
)

// exec returns the engine backend the worker of the given rank runs its
// model on, as Config.Device says.
func (r *runner) exec(rank int) (engine.Backend, error) {
	switch r.cfg.Device {
	case "cpu":
		return engine.CPU, nil
	case "cuda":
		return nil, fmt.Errorf("%w: -device cuda is not available in this build", ErrConfig)
	}
	return nil, fmt.Errorf("%w: unknown -device %q; use cpu or cuda", ErrConfig, r.cfg.Device)
}
