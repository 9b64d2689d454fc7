package mpi

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/sparsegrad/sparsegrad/comm"
)

// LibEnv is the environment variable that names the MPI library to load (a
// file name or a full path), overriding the default search for libmpi.so.40
// and then libmpi.so.
const LibEnv = "SPARSEGRAD_LIBMPI"

// ErrNoLibrary is wrapped by the error returned when no usable Open MPI library
// can be loaded.
var ErrNoLibrary = errors.New("mpi: Open MPI library not available")

// Values of Open MPI's mpi.h (Open MPI 4 and 5 share them).
const (
	mpiSuccess        = 0
	mpiThreadFunneled = 1
	mpiTagUBKey       = 0 // MPI_TAG_UB is the first predefined attribute key
	mpiMaxErrorString = 256
	mpiErrTruncate    = 15
)

// status mirrors Open MPI's struct ompi_status_public_t.
type status struct {
	Source, Tag, Error int32
	_                  int32  // cancelled
	_                  uint64 // ucount
}

// lib holds the loaded library: function addresses and predefined handles
// (Open MPI handles are addresses of exported globals).
type lib struct {
	path string

	initThread, initialized, finalized, finalize, abort      uintptr
	commRank, commSize, commDup, commFree, commSetErrhandler uintptr
	commGetAttr, errorString, getLibraryVersion              uintptr
	isend, irecv, test, getCount                             uintptr
	iallreduce, iallgather, iallgatherv, ibcast, ibarrier    uintptr
	allreduce                                                uintptr // blocking, for benchmarks
	memcpy                                                   uintptr // libc's, to read attribute values

	commWorld, tFloat, tInt32, tInt64, tInt16, opSum, errorsReturn uintptr

	// sc holds the out-parameters of MPI calls. C code receives their
	// addresses as plain integers, so they must live on the heap (a
	// goroutine stack may move during a call); only the engine goroutine
	// uses them.
	sc *scratch
}

type scratch struct {
	provided, rank, size, flag, count, n int32
	tagUB                                int32
	attr                                 uintptr
	errBuf                               [mpiMaxErrorString + 1]byte
	verBuf                               [8192]byte
}

// libCandidates are the names tried in order when LibEnv is unset.
var libCandidates = []string{"libmpi.so.40", "libmpi.so"}

// loadLib opens the MPI library: path if non-empty, else $SPARSEGRAD_LIBMPI,
// else the default candidates.
func loadLib(path string) (*lib, error) {
	names := libCandidates
	if path == "" {
		path = os.Getenv(LibEnv)
	}
	if path != "" {
		names = []string{path}
	}
	var tried []string
	for _, name := range names {
		h, err := dlopen(name)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		l, err := bindLib(h, name)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	return nil, fmt.Errorf("%w (tried %s); install Open MPI (Debian/Ubuntu: apt-get install openmpi-bin; on a cluster: load your cluster's Open MPI module) or set %s to the full path of libmpi.so",
		ErrNoLibrary, strings.Join(tried, "; "), LibEnv)
}

func bindLib(h uintptr, name string) (*lib, error) {
	l := &lib{path: name, sc: new(scratch)}
	syms := []struct {
		dst  *uintptr
		name string
	}{
		{&l.initThread, "MPI_Init_thread"}, {&l.initialized, "MPI_Initialized"},
		{&l.finalized, "MPI_Finalized"}, {&l.finalize, "MPI_Finalize"}, {&l.abort, "MPI_Abort"},
		{&l.commRank, "MPI_Comm_rank"}, {&l.commSize, "MPI_Comm_size"}, {&l.commDup, "MPI_Comm_dup"},
		{&l.commFree, "MPI_Comm_free"}, {&l.commSetErrhandler, "MPI_Comm_set_errhandler"},
		{&l.commGetAttr, "MPI_Comm_get_attr"}, {&l.errorString, "MPI_Error_string"},
		{&l.getLibraryVersion, "MPI_Get_library_version"},
		{&l.isend, "MPI_Isend"}, {&l.irecv, "MPI_Irecv"}, {&l.test, "MPI_Test"}, {&l.getCount, "MPI_Get_count"},
		{&l.iallreduce, "MPI_Iallreduce"}, {&l.iallgather, "MPI_Iallgather"}, {&l.iallgatherv, "MPI_Iallgatherv"},
		{&l.ibcast, "MPI_Ibcast"}, {&l.ibarrier, "MPI_Ibarrier"}, {&l.allreduce, "MPI_Allreduce"}, {&l.memcpy, "memcpy"},
		// Predefined handles of the Open MPI ABI.
		{&l.commWorld, "ompi_mpi_comm_world"}, {&l.tFloat, "ompi_mpi_float"}, {&l.tInt32, "ompi_mpi_int"},
		{&l.tInt64, "ompi_mpi_long_long_int"}, {&l.tInt16, "ompi_mpi_short"}, {&l.opSum, "ompi_mpi_op_sum"},
		{&l.errorsReturn, "ompi_mpi_errors_return"},
	}
	for _, s := range syms {
		p, err := dlsym(h, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("%w: %s does not export %s, so it is not an Open MPI 4/5 library (this backend uses the Open MPI ABI; MPICH and Intel MPI are not supported); point %s at Open MPI's libmpi.so",
				ErrNoLibrary, name, s.name, LibEnv)
		}
		*s.dst = p
	}
	return l, nil
}

// call invokes an MPI function and returns its C int result.
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// ptr is the address of *p, which must be heap memory that stays reachable
// until C is done with it.
func ptr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

// bufPtr is the address of b's first byte, or 0 for an empty slice.
func bufPtr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

// errString is MPI_Error_string of code.
func (l *lib) errString(code int32) string {
	buf, n := l.sc.errBuf[:], &l.sc.n
	if call(l.errorString, uintptr(code), ptr(&buf[0]), ptr(n)) != mpiSuccess || *n <= 0 || int(*n) > len(buf) {
		return fmt.Sprintf("MPI error %d", code)
	}
	return string(buf[:*n])
}

// version is MPI_Get_library_version's text (first line).
func (l *lib) version() string {
	buf, n := l.sc.verBuf[:], &l.sc.n
	if call(l.getLibraryVersion, ptr(&buf[0]), ptr(n)) != mpiSuccess || *n <= 0 || int(*n) > len(buf) {
		return "unknown"
	}
	s := strings.TrimRight(string(buf[:*n]), "\x00\n")
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(strings.TrimSuffix(s, ","))
}

// typeOf is the MPI datatype handle of a comm element type.
func (l *lib) typeOf(d comm.DType) uintptr {
	switch d {
	case comm.Float32:
		return l.tFloat
	case comm.Int32:
		return l.tInt32
	case comm.Int64:
		return l.tInt64
	case comm.Float16:
		return l.tInt16 // moved as 2-byte words; summed in Go (add)
	}
	return 0
}
