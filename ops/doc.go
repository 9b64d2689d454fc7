// Package ops owns the vocabulary of operations the project's models are
// built from and executed with: one exported descriptor per operation, the
// operation's exact semantics, and its CPU kernel, which is the numerical
// reference every other device's kernel is compared with.
//
// Two kinds of descriptors live here:
//
//   - The project's own Gorgonia ops, which models put into their graphs:
//     Conv2d (with Conv2dGradInput and Conv2dGradFilter), the BatchNorm
//     family (BatchNormStats, BatchNormRunningStats, BatchNorm,
//     BatchNormGradSums, BatchNormGradInput, BatchNormGradParam), AddReLU
//     and ReLUGrad, LogSumExp with SoftmaxCrossEntropy and its gradient,
//     MatMulT with its gradients, and LSTMCell (one fused LSTM time step,
//     built with LSTMStep) with LSTMCellGrad. In a graph each is a node's op
//     through a generic gorgonia.Op (and gorgonia.SDOp for the forward ops)
//     that wraps it, so Gorgonia's symbolic Grad differentiates graphs made
//     of them, and whose Do runs the CPU kernel, so Gorgonia's tape machine
//     can run such graphs too (tests use it as an independent reference).
//     Their fields are all an executor needs: no op hides state. Values that
//     must travel from a forward op to its gradient ops (BatchNorm's batch
//     statistics, the softmax's log-sum-exp, the LSTM cell's activated gates)
//     are nodes of the graph, and BatchNorm's running statistics are graph
//     inputs that BatchNormStats updates in place (Mutates).
//
//   - Normalised descriptors of the Gorgonia ops those graphs also contain
//     (elementwise Binary and Unary ops, MatMul, Broadcast, Sum, Slice,
//     SliceIncr, Concat, Gather, GatherGrad, Copy): package engine
//     translates Gorgonia's unexported op types into these when it compiles
//     a graph, so that a device's kernel table needs to know only this
//     package.
//
// Every descriptor implements Kernel: CPU computes the output from host
// arguments into a preallocated output, with scratch memory the caller
// provides (WorkspaceOf), so an executor allocates nothing per step. The CPU
// kernels reproduce Gorgonia's arithmetic for Gorgonia's ops (the same
// float32 functions and the same summation orders), so a graph gives the
// same bits on the tape machine and on the project's executor.
//
// Matrix products go through the BLAS chosen with UseBLAS or
// ConfigureBLAS (OpenBLAS loaded at run time when present, gonum's pure-Go
// BLAS otherwise).
package ops
