package netmodel

import (
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// DefaultElemBytes is the element size Project assumes when a run's byte
// counts cannot tell it (a run on one worker moves no bytes): float32 values
// and int32 indices, the common case.
const DefaultElemBytes = 4

// Payload returns the average payload of one call of op, in bytes, as one
// rank of a run on n workers recorded it in st (see comm.Counter): the buffer
// of AllReduce and Broadcast, the whole send buffer of ReduceScatter (the sum
// of its counts), this rank's contribution to AllGather and AllGatherV, the
// message of Send, Recv and SendRecv. It inverts comm.Traffic's byte counts,
// so it is exact for any element size; where they carry no information (n ==
// 1, or a broadcast root that only sends) it uses st.Elements ×
// DefaultElemBytes. AllGatherV and ReduceScatter are inverted as if all ranks'
// counts were equal.
func Payload(op comm.Op, n int, st comm.OpStats) float64 {
	if st.Calls == 0 {
		return 0
	}
	calls := float64(st.Calls)
	fallback := float64(st.Elements) * DefaultElemBytes / calls
	recv := float64(st.BytesRecv) / calls
	sent := float64(st.BytesSent) / calls
	k := float64(n - 1)
	var p float64
	switch op {
	case comm.OpSend, comm.OpSendRecv:
		p = sent
	case comm.OpRecv:
		p = recv
	case comm.OpBarrier:
		return 0
	default:
		if n <= 1 {
			break
		}
		switch op {
		case comm.OpAllReduce:
			p = recv * float64(n) / (2 * k)
		case comm.OpAllGather, comm.OpAllGatherV:
			p = recv / k
		case comm.OpReduceScatter:
			p = recv * float64(n) / k
		case comm.OpBroadcast:
			p = recv
		}
	}
	if p == 0 {
		return fallback
	}
	return p
}

// Projection is the estimated communication time of a run per Op, and in
// total, on another worker count and network.
type Projection struct {
	// Workers is the worker count projected to.
	Workers int
	// Net is the network projected to.
	Net Network
	// PerOp is the projected time of each op's calls.
	PerOp map[comm.Op]time.Duration
	// Total is the sum of PerOp.
	Total time.Duration
}

// Project estimates how long the communication that one rank recorded in
// stats during a run on from workers would take on to workers over net. Each
// op's calls are replayed with their average payload (see Payload) through
// Network.Cost, scaled as follows:
//
//   - AllReduce, Broadcast, ReduceScatter and point-to-point messages keep
//     their payload: a dense gradient has the same size whatever n, so only
//     the algorithm's n-dependence (e.g. ring all-reduce's 2(n−1)/n and
//     2(n−1)α) changes the time.
//   - AllGather and AllGatherV keep each rank's contribution, so the gathered
//     total grows linearly with n: this is why all-gather based sparse
//     methods (Top-k, DRAGONN, the index exchange of DEFT) scale worse than
//     dense all-reduce at large n.
//   - The number of calls is kept. Methods whose call count depends on n
//     (SparDL's log₂ n rounds, gTop-k's tree, TopkDSA's and Ok-Topk's one
//     message per peer) or whose payload does (the union of DEFT's, Top-k's
//     or the threshold baseline's indices grows with n; MiCRO's per-worker
//     share of the budget shrinks) must be re-measured at a few n, or the
//     caller adjusts stats first (package reports leaves them out of its
//     projection chart).
//
// It returns an error if the worker counts or net are invalid.
func Project(stats map[comm.Op]comm.OpStats, from, to int, net Network) (Projection, error) {
	if from < 1 || to < 1 {
		return Projection{}, fmt.Errorf("netmodel: Project: worker counts %d -> %d are invalid: both must be >= 1", from, to)
	}
	if err := net.Validate(); err != nil {
		return Projection{}, fmt.Errorf("netmodel: Project: %w", err)
	}
	p := Projection{Workers: to, Net: net, PerOp: make(map[comm.Op]time.Duration)}
	for op, st := range stats {
		if st.Calls <= 0 {
			continue
		}
		m := Payload(op, from, st)
		var one time.Duration
		switch op {
		case comm.OpAllGather:
			one = net.AllGatherTime(to, int64(m+0.5))
		case comm.OpAllGatherV:
			one = net.AllGatherVTime(equal(to, m))
		case comm.OpReduceScatter:
			one = net.ReduceScatterRing(equal(to, m/float64(to)))
		default:
			// Cost's element-based interface with 1-byte elements.
			one = net.Cost(op, to, int(m+0.5), 1, nil)
		}
		d := time.Duration(float64(one) * float64(st.Calls))
		p.PerOp[op] = d
		p.Total += d
	}
	return p, nil
}

func equal(n int, b float64) []int64 {
	bs := make([]int64, n)
	for i := range bs {
		bs[i] = int64(b + 0.5)
	}
	return bs
}
