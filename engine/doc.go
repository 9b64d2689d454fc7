// Package engine owns the execution of the models' Gorgonia graphs: it
// compiles a graph once into a Program (topologically sorted instructions
// over the op vocabulary of package ops, views instead of copies for
// reshapes and contiguous slices, every value typed and sized), plans the
// program's memory by liveness (values share one arena; an elementwise op
// overwrites an input that dies with it; a parameter's gradient is computed
// straight into its place in the caller's gradient vector), and runs it on
// a device through that device's kernel table (Backend). Nothing is
// allocated per step.
//
// Because the executor runs every instruction itself, it knows the moment a
// parameter's gradient is final and reports it (GradHook) with an event of
// the device's stream: the hook that LAGS pipelining and overlapped
// communication use, on the CPU and on GPUs alike. It also times the
// forward and the backward part of a training step (the program runs all
// instructions of the loss first).
//
// The CPU backend (CPU) runs the ops' CPU kernels, which reproduce
// Gorgonia's arithmetic: a graph gives the same bits here as on Gorgonia's
// tape machine. With oneDNN configured (ConfigureCPU; the library is loaded
// at run time by internal/native/dnnl) it runs convolutions and batch
// normalisation through oneDNN instead, on memory formats it plans for the
// whole program (layout.go), within float32 rounding of the reference
// kernels. Package cuda provides the GPU backend.
package engine
