// Package models owns the three benchmark models of the project — ResNet-18
// (CIFAR variant), the LSTM language model and NCF (NeuMF): their Gorgonia
// graphs in float32 (built once per batch shape and differentiated with
// Gorgonia's symbolic Grad), their losses and evaluation metrics (top-1
// accuracy, perplexity, HR@10 and NDCG@10), the stable parameter order the
// gradient reducers see, their initialisation, and the per-parameter
// "gradient is final" hook used for LAGS-style pipelining and overlapped
// communication.
//
// Every model implements Model: it is built for one training batch size
// on one device, keeps its parameters in one flat vector in layout order
// (the order of PyTorch's named_parameters in the reference code), writes
// the gradient of a training step into a caller-owned flat vector in the
// same order, and stores its non-trainable buffers (BatchNorm running
// statistics) flat too. Pool shares executors between in-process workers.
//
// The graphs are made of the ops of package ops (convolution, the fused
// BatchNorm family, fused ReLU, softmax cross-entropy, the tied decoder's
// transposed product) and Gorgonia's own elementwise and shape ops. They are
// not run by Gorgonia's tape machine: package engine compiles each graph
// into a program with planned memory and runs it on the model's device
// through that device's kernel table (net.go holds what the three models
// share: the compiled training and evaluation programs, the buffers and the
// staging of inputs). On the CPU the matrix products go through the BLAS
// chosen by ops.ConfigureBLAS (or ops.UseBLAS): OpenBLAS loaded at run time when
// the shared library is installed (package internal/native/blas; no cgo and no
// build flag), gonum's pure-Go BLAS otherwise; convolutions and batch
// norms run through oneDNN where it is installed (engine.ConfigureCPU,
// train's -kernels), im2col and the BLAS otherwise. Every model is checked
// against a plain float64 re-implementation in its tests and by finite
// differences.
//
// A new model implements Model here; the trainer learns of it from its
// workload, declared in a file of its own in package train
// (workload_resnet18.go is one).
//
// The package knows nothing about sparsification or communication.
package models
