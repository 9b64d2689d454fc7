// Package models owns the three benchmark models of the project — ResNet-18
// (CIFAR variant), the LSTM language model and NCF (NeuMF) — built as
// Gorgonia graphs executed by Gorgonia's CPU tape machine in float32, their
// losses and evaluation metrics (top-1 accuracy, perplexity, HR@10 and
// NDCG@10), the stable parameter order the gradient reducers see, and the
// per-parameter "gradient is final" hook used for LAGS-style pipelining.
//
// Every model implements Model: it is built for one training batch size,
// keeps its parameters in one flat []float32 in layout order (the order of
// PyTorch's named_parameters in the reference code), writes the gradient of
// a training step into a caller-owned flat []float32 in the same order, and
// stores its non-trainable buffers (BatchNorm running statistics) flat too.
//
// Matrix products go through the BLAS chosen by ConfigureBLAS (or UseBLAS):
// OpenBLAS loaded at run time when the shared library is installed (see the
// internal/blas package; no cgo and no build flag), gonum's pure-Go BLAS
// otherwise.
//
// Where Gorgonia's own ops were wrong or slow, the graphs use the package's
// custom Gorgonia ops (a fork of Gorgonia is never needed): convolution
// (conv.go; Gorgonia's Conv2d filter gradient is wrong), fused BatchNorm
// and ReLU (bn.go), fused softmax cross-entropy (xent.go) and a product
// with a transposed operand for the tied LSTM decoder (matmul.go). Every
// model is checked against a plain float64 re-implementation in its tests
// and by finite differences.
//
// The package knows nothing about sparsification or communication.
package models
