package cuda

import (
	"fmt"
	"sync/atomic"
)

// HostCounts is what the host has asked of the GPUs of the process: work
// issued, waits and transfers. The package counts them as it goes (a few
// atomic additions per call, nothing that waits), so a caller measures
// what a training step costs the host by the difference of two Counts.
type HostCounts struct {
	// Launches is the work issued to streams: kernels, cuBLAS and cuDNN
	// calls, memsets, device-to-device copies, NCCL calls and graph
	// launches (each one call of the host).
	Launches int64 `json:"launches"`
	// Graphs is how many of the launches replayed a CUDA graph.
	Graphs int64 `json:"graphs"`
	// Syncs is the host's waits for the device: stream, event and context
	// synchronisations (an NCCL call waits on the host only for a buffer
	// without a stream, and Barrier; its watchdog's looks are no waits).
	Syncs int64 `json:"syncs"`
	// HtoD and DtoH are the bytes copied from host to device memory and
	// back.
	HtoD int64 `json:"htod_bytes"`
	DtoH int64 `json:"dtoh_bytes"`
	// Allocs and Frees count device allocations and frees (cuMemAlloc,
	// cuMemFree), and PinnedAllocs page-locked host allocations.
	Allocs       int64 `json:"allocs"`
	Frees        int64 `json:"frees"`
	PinnedAllocs int64 `json:"pinned_allocs"`
	// CtxSets is how many times a call made a device's context current
	// on its OS thread (cuCtxSetCurrent, with the thread locked): once per
	// held burst of work (Stream.Hold), and once per call outside one.
	CtxSets int64 `json:"ctx_sets"`
	// Unheld is how many of a stream's calls (launches, copies, memsets,
	// records, waits) were issued with the stream not held, each paying
	// its own context switch: 0 in a training step after the first two.
	Unheld int64 `json:"unheld"`
}

// counts is the process's running total.
var counts struct {
	launches, graphs, syncs, htod, dtoh, allocs, frees, pinned, ctxSets, unheld atomic.Int64
}

// Counts returns what the host has asked of the process's GPUs so far.
func Counts() HostCounts {
	return HostCounts{
		Launches: counts.launches.Load(), Graphs: counts.graphs.Load(), Syncs: counts.syncs.Load(),
		HtoD: counts.htod.Load(), DtoH: counts.dtoh.Load(),
		Allocs: counts.allocs.Load(), Frees: counts.frees.Load(), PinnedAllocs: counts.pinned.Load(),
		CtxSets: counts.ctxSets.Load(), Unheld: counts.unheld.Load(),
	}
}

// Sub returns c − o: what was asked between two Counts.
func (c HostCounts) Sub(o HostCounts) HostCounts {
	return HostCounts{
		Launches: c.Launches - o.Launches, Graphs: c.Graphs - o.Graphs, Syncs: c.Syncs - o.Syncs,
		HtoD: c.HtoD - o.HtoD, DtoH: c.DtoH - o.DtoH,
		Allocs: c.Allocs - o.Allocs, Frees: c.Frees - o.Frees, PinnedAllocs: c.PinnedAllocs - o.PinnedAllocs,
		CtxSets: c.CtxSets - o.CtxSets, Unheld: c.Unheld - o.Unheld,
	}
}

// String is the counts in one line.
func (c HostCounts) String() string {
	return fmt.Sprintf("%d launches (%d graphs), %d syncs, %d B to the device, %d B to the host, %d allocations, %d frees, %d pinned allocations, %d context switches (%d calls on streams not held)",
		c.Launches, c.Graphs, c.Syncs, c.HtoD, c.DtoH, c.Allocs, c.Frees, c.PinnedAllocs, c.CtxSets, c.Unheld)
}
