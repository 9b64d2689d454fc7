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
// Matrix products go through the BLAS chosen by UseBLAS: OpenBLAS loaded at
// run time when the shared library is installed (see the internal/blas
// package), gonum's pure-Go BLAS otherwise.
//
// The package knows nothing about sparsification or communication.
package models
