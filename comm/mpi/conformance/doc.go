// Package conformance holds only tests: they run every registered sparsify
// reducer under a real mpirun (2, 3 and 4 processes) over the Open MPI
// backend and require outputs and residuals bit-identical to the same
// reducer's on the in-process backend. It is separate from package mpi so
// that the backend's own tests do not depend on the reducers.
package conformance
