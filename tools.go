//go:build tools

// This file only pins dependencies in go.mod that later packages use
// (Gorgonia, its tensor package, and gorgonia.org/cu v0.9.6, which Gorgonia's
// own go.mod pins too low for CUDA 12+); it is never built.
package tools

import (
	_ "gorgonia.org/cu"
	_ "gorgonia.org/gorgonia"
	_ "gorgonia.org/tensor"
)
