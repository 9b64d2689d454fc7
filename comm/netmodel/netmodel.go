// Package netmodel owns the α-β model of a cluster network: the modelled time
// of every communicator call under the algorithms an MPI or NCCL library uses
// (ring, recursive doubling, Bruck, binomial tree), the precise delay that
// comm/local uses to emulate such a network on one machine, the same
// emulation between processes (Emulate: the network of an mpirun job on one
// machine made to behave as the modelled one), and the
// projection of a recorded run's communication time to other worker counts and
// networks.
//
// # The model
//
// Sending one message of b bytes between two ranks takes α + b/β, where α is
// the per-message latency (Network.Latency) and β the bandwidth in bytes per
// second (Network.Bandwidth). Links are full duplex and every rank can send
// one message and receive one message at the same time, so a step of an
// algorithm in which every rank exchanges with a partner costs α + b/β for the
// largest b of the step. With n ranks, m the buffer size in bytes and
// ⌈log₂ n⌉ written lg n:
//
//	point-to-point               α + m/β
//	all-reduce, ring             2(n−1)α + 2(n−1)/n · m/β
//	all-reduce, rec. doubling    lg n · (α + m/β)     (+2 steps if n is not a power of 2)
//	all-gather, ring             (n−1)α + (n−1) · m/β        (m per rank)
//	all-gather, Bruck            lg n · α + (n−1) · m/β      (m per rank)
//	all-gather-v, ring           (n−1) · (α + max_r m_r/β)
//	all-gather-v, Bruck          lg n · α + (M − min_r m_r)/β  (M = Σ m_r)
//	reduce-scatter, ring         (n−1) · (α + max_r m_r/β)   (blocks m_r)
//	broadcast, binomial tree     lg n · (α + m/β)
//	broadcast, scatter+allgather (lg n + n − 1)α + 2(n−1)/n · m/β
//	barrier (dissemination)      lg n · α
//
// With Algorithm Auto (the zero value) each call uses whichever of its
// algorithms the model says is faster, which is what a tuned library's
// size-based switch approximates: latency-bound small messages take recursive
// doubling / Bruck / the binomial tree, bandwidth-bound large ones the ring /
// scatter-allgather. For all-reduce the switch is at the m where
// lg n·(α + m/β) = 2(n−1)α + 2(n−1)/n·m/β, i.e. for n > 2 a power of two
// m* = β·α·(2(n−1) − lg n) / (lg n − 2(n−1)/n) (n = 4: m* = 8αβ, 500 kB at
// 50 µs and 10 Gbit/s); below m* recursive doubling wins. For n = 2 recursive
// doubling (one exchange, α + m/β) always beats the ring (2α + m/β). The
// Algorithm fields of Network fix an algorithm instead.
package netmodel

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// Algorithm selects how a collective is modelled.
type Algorithm uint8

// The algorithms of the model.
const (
	// Auto picks the algorithm with the smallest modelled time.
	Auto Algorithm = iota
	// Ring is the bandwidth-optimal ring (all-reduce, all-gather(-v),
	// reduce-scatter) or, for broadcast, scatter followed by a ring
	// all-gather.
	Ring
	// RecursiveDoubling is the latency-optimal all-reduce.
	RecursiveDoubling
	// Bruck is the latency-optimal all-gather(-v).
	Bruck
	// BinomialTree is the latency-optimal broadcast.
	BinomialTree
)

// String names the algorithm.
func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Ring:
		return "ring"
	case RecursiveDoubling:
		return "recursive-doubling"
	case Bruck:
		return "bruck"
	case BinomialTree:
		return "binomial-tree"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Network is an α-β model of a cluster network.
type Network struct {
	// Latency is α, the time of an empty message.
	Latency time.Duration
	// Bandwidth is β in bytes per second (10 Gbit/s Ethernet: 10e9/8).
	Bandwidth float64
	// AllReduce fixes the all-reduce algorithm (Ring or RecursiveDoubling);
	// Auto picks the faster.
	AllReduce Algorithm
	// AllGather fixes the all-gather and all-gather-v algorithm (Ring or
	// Bruck); Auto picks the faster.
	AllGather Algorithm
	// Broadcast fixes the broadcast algorithm (BinomialTree or Ring, i.e.
	// scatter + all-gather); Auto picks the faster.
	Broadcast Algorithm
}

// Ethernet10G is a 10 Gbit/s Ethernet cluster network with 50 µs latency.
var Ethernet10G = Network{Latency: 50 * time.Microsecond, Bandwidth: 10e9 / 8}

// Validate reports a network the model cannot use.
func (net Network) Validate() error {
	if net.Latency < 0 {
		return fmt.Errorf("netmodel: latency %v is negative: use a latency >= 0", net.Latency)
	}
	if !(net.Bandwidth > 0) || math.IsInf(net.Bandwidth, 0) {
		return fmt.Errorf("netmodel: bandwidth %v bytes/s is invalid: use a finite bandwidth > 0 in bytes per second (10 Gbit/s = 1.25e9)", net.Bandwidth)
	}
	check := func(what string, a Algorithm, ok ...Algorithm) error {
		if a == Auto {
			return nil
		}
		for _, o := range ok {
			if a == o {
				return nil
			}
		}
		return fmt.Errorf("netmodel: %s algorithm %v is not modelled: use auto or one of %v", what, a, ok)
	}
	return errors.Join(
		check("all-reduce", net.AllReduce, Ring, RecursiveDoubling),
		check("all-gather", net.AllGather, Ring, Bruck),
		check("broadcast", net.Broadcast, BinomialTree, Ring))
}

func (net Network) alpha() float64 { return net.Latency.Seconds() }

// xfer is the transfer time of b bytes, in seconds.
func (net Network) xfer(b float64) float64 { return b / net.Bandwidth }

func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Round(s * 1e9))
}

// lg is ⌈log₂ n⌉.
func lg(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// PointToPoint is the time of one message of b bytes: α + b/β.
func (net Network) PointToPoint(b int64) time.Duration {
	return seconds(net.alpha() + net.xfer(float64(b)))
}

// AllReduceRing is 2(n−1)α + 2(n−1)/n · m/β for m bytes on n ranks.
func (net Network) AllReduceRing(n int, m int64) time.Duration {
	if n <= 1 {
		return 0
	}
	k := float64(n - 1)
	return seconds(2*k*net.alpha() + 2*k/float64(n)*net.xfer(float64(m)))
}

// AllReduceRecursiveDoubling is s · (α + m/β) with s = log₂ n steps when n is
// a power of two and ⌊log₂ n⌋ + 2 otherwise (the extra ranks first fold into
// partners and get the result back at the end).
func (net Network) AllReduceRecursiveDoubling(n int, m int64) time.Duration {
	if n <= 1 {
		return 0
	}
	steps := bits.Len(uint(n)) - 1
	if n&(n-1) != 0 {
		steps += 2
	}
	return seconds(float64(steps) * (net.alpha() + net.xfer(float64(m))))
}

// AllReduceTime is the all-reduce of m bytes on n ranks under net's
// algorithm choice.
func (net Network) AllReduceTime(n int, m int64) time.Duration {
	switch net.AllReduce {
	case Ring:
		return net.AllReduceRing(n, m)
	case RecursiveDoubling:
		return net.AllReduceRecursiveDoubling(n, m)
	}
	return min(net.AllReduceRing(n, m), net.AllReduceRecursiveDoubling(n, m))
}

// AllGatherVRing is (n−1) · (α + max_r b_r/β) for per-rank contributions of
// b_r bytes: in each of the n−1 steps every rank forwards one block, and the
// step lasts as long as its largest block. With equal blocks of m bytes it is
// the ring all-gather's (n−1)α + (n−1)·m/β.
func (net Network) AllGatherVRing(b []int64) time.Duration {
	n := len(b)
	if n <= 1 {
		return 0
	}
	var mx int64
	for _, v := range b {
		mx = max(mx, v)
	}
	return seconds(float64(n-1) * (net.alpha() + net.xfer(float64(mx))))
}

// AllGatherVBruck is ⌈log₂ n⌉α + (M − min_r b_r)/β with M = Σ b_r: log n
// rounds of doubling messages, in which each rank receives every block but
// its own (the slowest rank is the one with the smallest own block).
func (net Network) AllGatherVBruck(b []int64) time.Duration {
	n := len(b)
	if n <= 1 {
		return 0
	}
	var total int64
	mn := b[0]
	for _, v := range b {
		total += v
		mn = min(mn, v)
	}
	return seconds(float64(lg(n))*net.alpha() + net.xfer(float64(total-mn)))
}

// AllGatherVTime is the all-gather(-v) of per-rank contributions of b[r]
// bytes under net's algorithm choice.
func (net Network) AllGatherVTime(b []int64) time.Duration {
	switch net.AllGather {
	case Ring:
		return net.AllGatherVRing(b)
	case Bruck:
		return net.AllGatherVBruck(b)
	}
	return min(net.AllGatherVRing(b), net.AllGatherVBruck(b))
}

// AllGatherTime is the all-gather of m bytes per rank on n ranks: ring
// (n−1)α + (n−1)·m/β or Bruck ⌈log₂ n⌉α + (n−1)·m/β.
func (net Network) AllGatherTime(n int, m int64) time.Duration {
	b := make([]int64, max(n, 0))
	for i := range b {
		b[i] = m
	}
	return net.AllGatherVTime(b)
}

// ReduceScatterRing is (n−1) · (α + max_r b_r/β) for blocks of b_r bytes; with
// equal blocks of a buffer of M bytes, (n−1)α + (n−1)/n · M/β.
func (net Network) ReduceScatterRing(b []int64) time.Duration {
	return net.AllGatherVRing(b)
}

// BroadcastBinomial is ⌈log₂ n⌉ · (α + m/β).
func (net Network) BroadcastBinomial(n int, m int64) time.Duration {
	return seconds(float64(lg(n)) * (net.alpha() + net.xfer(float64(m))))
}

// BroadcastScatterAllGather is (⌈log₂ n⌉ + n − 1)α + 2(n−1)/n · m/β: a binomial
// scatter of the n chunks followed by a ring all-gather (van de Geijn).
func (net Network) BroadcastScatterAllGather(n int, m int64) time.Duration {
	if n <= 1 {
		return 0
	}
	k := float64(n - 1)
	return seconds(float64(lg(n)+n-1)*net.alpha() + 2*k/float64(n)*net.xfer(float64(m)))
}

// BroadcastTime is the broadcast of m bytes under net's algorithm choice.
func (net Network) BroadcastTime(n int, m int64) time.Duration {
	switch net.Broadcast {
	case BinomialTree:
		return net.BroadcastBinomial(n, m)
	case Ring:
		return net.BroadcastScatterAllGather(n, m)
	}
	return min(net.BroadcastBinomial(n, m), net.BroadcastScatterAllGather(n, m))
}

// BarrierTime is the dissemination barrier: ⌈log₂ n⌉α.
func (net Network) BarrierTime(n int) time.Duration {
	return seconds(float64(lg(n)) * net.alpha())
}

// Cost is the modelled time of one call of op on n ranks, with the arguments
// comm.Traffic takes: elems is the buffer length (AllReduce, Broadcast), the
// send length (AllGather) or the message length (Send, Recv, SendRecv);
// counts are the per-rank lengths of AllGatherV and ReduceScatter; esize is
// the element size in bytes. A single rank communicates with nobody: every
// collective costs 0 when n == 1.
func (net Network) Cost(op comm.Op, n, elems, esize int, counts []int) time.Duration {
	m := int64(elems) * int64(esize)
	blocks := func() []int64 {
		b := make([]int64, len(counts))
		for i, c := range counts {
			b[i] = int64(c) * int64(esize)
		}
		return b
	}
	switch op {
	case comm.OpSend, comm.OpRecv, comm.OpSendRecv:
		return net.PointToPoint(m)
	}
	if n <= 1 {
		return 0
	}
	switch op {
	case comm.OpAllReduce:
		return net.AllReduceTime(n, m)
	case comm.OpAllGather:
		return net.AllGatherTime(n, m)
	case comm.OpAllGatherV:
		return net.AllGatherVTime(blocks())
	case comm.OpReduceScatter:
		return net.ReduceScatterRing(blocks())
	case comm.OpBroadcast:
		return net.BroadcastTime(n, m)
	case comm.OpBarrier:
		return net.BarrierTime(n)
	}
	return 0
}
