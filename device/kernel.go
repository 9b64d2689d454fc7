package device

// Kernel is an element-wise pass over whole vectors that a package declares
// beside the code that needs it (a sparsification method's own operation),
// for every device: its CUDA C, which a GPU compiles the first time it runs
// it, and the same computation in Go for host memory. Both must give the
// same bits for the same input.
//
// CUDA is one extern "C" __global__ function named Name whose loop is
// grid-stride over its n elements (GRID_STRIDE(i, n)); besides the CUDA C
// language it may use what every kernel of package cuda may: the types i64,
// u32 and u64 and the macro GRID_STRIDE. Its device functions, macros and
// types must have names of their own (prefixed with the kernel's), since
// a test build compiles every declared kernel into one program. Its
// parameters are pointers (a Buffer's memory), int or unsigned int (int32,
// uint32), long long (int64), float (float32) and double (float64), in the
// order of the launch's arguments. A kernel launched over n = 1 runs as one
// block and may instead share the work among the block's threads
// (threadIdx, blockDim, __syncthreads; sparsify's k_deft_plan).
//
// Host runs the pass over host memory with the launch's n and arguments:
// the Buffers are host memory of the types the kernel reads.
type Kernel struct {
	Name string
	CUDA string
	Host func(n int, args ...any)
}
