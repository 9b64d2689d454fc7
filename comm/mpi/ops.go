package mpi

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
)

// reqOp is an operation made of MPI non-blocking calls that each return one
// request: a collective of the library (integer all-reduce, all-gather(v),
// broadcast, barrier) or point-to-point sends and receives.
type reqOp struct {
	what string
	// post issues the MPI calls, storing one request per call in reqs.
	post func(e *engine, reqs []uintptr) int32
	nreq int
	// n is the result of a completed op, unless recvIdx >= 0: then it is
	// the element count of that request's received message.
	n       int
	recvIdx int
	recvT   comm.DType
	recvCap int
	peer    int // source rank of the receive, for messages

	keep []any // Go memory MPI uses until completion (buffers, count arrays)
	// poll marks ops whose progress is invisible until they complete: the
	// engine polls them without sleeping.
	poll   bool
	reqs   []uintptr
	done   []bool
	ndone  int
	status status
	got    int
}

func (o *reqOp) describe() string { return o.what }

func (o *reqOp) busy() bool { return o.poll }

func (o *reqOp) start(e *engine) error {
	o.reqs = make([]uintptr, o.nreq)
	o.done = make([]bool, o.nreq)
	if rc := o.post(e, o.reqs); rc != mpiSuccess {
		return fmt.Errorf("mpi: rank %d: %s: %s", e.rank, o.what, e.l.errString(rc))
	}
	return nil
}

func (o *reqOp) progress(e *engine) (done, moved bool, n int, err error) {
	for i := range o.reqs {
		if o.done[i] {
			continue
		}
		st, flag := &o.status, &e.l.sc.flag
		rc := call(e.l.test, ptr(&o.reqs[i]), ptr(flag), ptr(st))
		if rc == mpiSuccess && *flag == 0 {
			continue
		}
		o.done[i] = true
		o.ndone++
		moved = true
		if rc != mpiSuccess {
			if i == o.recvIdx && (rc == mpiErrTruncate || st.Error == mpiErrTruncate) {
				return true, true, 0, fmt.Errorf("mpi: rank %d: %s: the message from rank %d is longer than the receive buffer of %d elements; pass a buffer as long as the longest message",
					e.rank, o.what, o.peer, o.recvCap)
			}
			return true, true, 0, fmt.Errorf("mpi: rank %d: %s: %s", e.rank, o.what, e.l.errString(rc))
		}
		if i == o.recvIdx {
			cnt := &e.l.sc.count
			if rc := call(e.l.getCount, ptr(st), e.l.typeOf(o.recvT), ptr(cnt)); rc != mpiSuccess || *cnt < 0 {
				return true, true, 0, fmt.Errorf("mpi: rank %d: %s: the received message is not a whole number of %s elements", e.rank, o.what, o.recvT)
			}
			o.got = int(*cnt)
		}
	}
	if o.ndone < len(o.reqs) {
		return false, moved, 0, nil
	}
	if o.recvIdx >= 0 {
		return true, true, o.got, nil
	}
	return true, true, o.n, nil
}

// ringOp is the canonical-order float or integer all-reduce on MPI
// point-to-point messages: a ring reduce-scatter, then the ring all-gather
// (the all-gather alone for AllGather and AllGatherV). Rank r sends to r+1 and receives from r−1. In
// reduce-scatter step t (0 ≤ t < n−1) it sends block r−1−t and receives block
// r−2−t, which it adds to its own values: block j therefore accumulates the
// ranks' values in the order j+1, …, n−1, 0, …, j and ends at rank j. In
// all-gather step u it forwards block r−u and receives block r−1−u.
//
// Each block is cut into segments of at most segBytes; the messages of all
// steps form one pipeline in which segment g of step t is sent as soon as
// segment g of step t−1 has arrived (and been added), with up to window
// receives posted ahead. Messages between a pair of ranks on one tag match in
// posting order, which is the same on both sides.
type ringOp struct {
	what       string
	dt         comm.DType
	esz        int
	n, r       int
	bounds     []int  // n+1 block offsets in elements
	src        []byte // own contributions, read only (== work)
	work       []byte // where reduced blocks are written (indexed like src)
	gatherOnly bool   // skip the reduce-scatter phase (AllGather(V)): work already holds block r
	segElems   int
	window     int
	tag        int

	sends, recvs         []ringMsg
	sendStart, recvStart []int // index of the first message of each step
	sendReq, recvReq     []uintptr
	sendDone, recvDone   []bool
	recvSlot             []int // tmp slot of a posted reduce-scatter receive
	nextSend, nextRecv   int
	nSendDone, nRecvDone int
	inflight             int
	tmp                  [][]byte
	freeSlots            []int
	postedSends          []int // indices of posted, unfinished sends
	postedRecvs          []int
}

// ringMsg is one message: step t, elements [lo, hi) of the full buffer.
type ringMsg struct {
	t      int
	lo, hi int
}

func (o *ringOp) describe() string { return o.what }

func mod(a, n int) int { return ((a % n) + n) % n }

// steps returns the range [first, end) of the steps this ring runs.
func (o *ringOp) steps() (first, end int) {
	if o.gatherOnly {
		return o.n - 1, 2 * (o.n - 1)
	}
	return 0, 2 * (o.n - 1)
}

func (o *ringOp) sendBlock(t int) int {
	if t < o.n-1 {
		return mod(o.r-1-t, o.n)
	}
	return mod(o.r-(t-(o.n-1)), o.n)
}

func (o *ringOp) recvBlock(t int) int {
	if t < o.n-1 {
		return mod(o.r-2-t, o.n)
	}
	return mod(o.r-1-(t-(o.n-1)), o.n)
}

// segments appends the messages of step t over block b.
func (o *ringOp) segments(list []ringMsg, t, b int) []ringMsg {
	lo, hi := o.bounds[b], o.bounds[b+1]
	for s := lo; s < hi; s += o.segElems {
		list = append(list, ringMsg{t, s, min(s+o.segElems, hi)})
	}
	return list
}

func (o *ringOp) start(e *engine) error {
	// Collectives start in the same order on every rank, so the sequence
	// number gives every ring its own tag on every rank.
	e.collSeq++
	o.tag = int(e.collSeq & tagLimit)
	first, T := o.steps()
	o.sendStart = make([]int, T+1)
	o.recvStart = make([]int, T+1)
	for t := 0; t < T; t++ {
		o.sendStart[t] = len(o.sends)
		o.recvStart[t] = len(o.recvs)
		if t >= first {
			o.sends = o.segments(o.sends, t, o.sendBlock(t))
			o.recvs = o.segments(o.recvs, t, o.recvBlock(t))
		}
	}
	o.sendStart[T], o.recvStart[T] = len(o.sends), len(o.recvs)
	o.sendReq = make([]uintptr, len(o.sends))
	o.recvReq = make([]uintptr, len(o.recvs))
	o.sendDone = make([]bool, len(o.sends))
	o.recvDone = make([]bool, len(o.recvs))
	o.recvSlot = make([]int, len(o.recvs))
	nslot := min(o.window, o.recvStart[min(T, o.n-1)]) // reduce-scatter receives
	slot := 0
	for _, m := range o.recvs[:o.recvStart[min(T, o.n-1)]] {
		slot = max(slot, m.hi-m.lo)
	}
	o.tmp = make([][]byte, nslot)
	for i := range o.tmp {
		o.tmp[i] = e.getTmp(slot * o.esz)
		o.freeSlots = append(o.freeSlots, i)
	}
	_, err := o.post(e)
	return err
}

// region is the byte range [lo, hi) elements of b.
func (o *ringOp) region(b []byte, lo, hi int) []byte { return b[lo*o.esz : hi*o.esz] }

// post issues every receive and send that may start now.
func (o *ringOp) post(e *engine) (bool, error) {
	moved := false
	next, prev := mod(o.r+1, o.n), mod(o.r-1, o.n)
	typ := e.l.typeOf(o.dt)
	for o.nextRecv < len(o.recvs) && o.inflight < o.window {
		i := o.nextRecv
		m := o.recvs[i]
		var dst []byte
		if m.t < o.n-1 {
			if len(o.freeSlots) == 0 {
				break
			}
			s := o.freeSlots[len(o.freeSlots)-1]
			o.freeSlots = o.freeSlots[:len(o.freeSlots)-1]
			o.recvSlot[i] = s
			dst = o.tmp[s][:(m.hi-m.lo)*o.esz]
		} else {
			// All-gather: the region was sent in reduce-scatter step
			// t−(n−1); it may be overwritten only once that send is done.
			if !o.gatherOnly {
				j := o.sendStart[m.t-(o.n-1)] + (i - o.recvStart[m.t])
				if !o.sendDone[j] {
					break
				}
			}
			dst = o.region(o.work, m.lo, m.hi)
		}
		if rc := call(e.l.irecv, bufPtr(dst), uintptr(m.hi-m.lo), typ, uintptr(prev), uintptr(o.tag), e.coll, ptr(&o.recvReq[i])); rc != mpiSuccess {
			return moved, fmt.Errorf("mpi: rank %d: %s: MPI_Irecv: %s", e.rank, o.what, e.l.errString(rc))
		}
		o.postedRecvs = append(o.postedRecvs, i)
		o.inflight++
		o.nextRecv++
		moved = true
	}
	for o.nextSend < len(o.sends) {
		i := o.nextSend
		m := o.sends[i]
		var src []byte
		if m.t == 0 {
			src = o.region(o.src, m.lo, m.hi)
		} else if o.gatherOnly && m.t == o.n-1 {
			src = o.region(o.work, m.lo, m.hi) // own block, copied in
		} else {
			j := o.recvStart[m.t-1] + (i - o.sendStart[m.t])
			if !o.recvDone[j] {
				break
			}
			src = o.region(o.work, m.lo, m.hi)
		}
		if rc := call(e.l.isend, bufPtr(src), uintptr(m.hi-m.lo), typ, uintptr(next), uintptr(o.tag), e.coll, ptr(&o.sendReq[i])); rc != mpiSuccess {
			return moved, fmt.Errorf("mpi: rank %d: %s: MPI_Isend: %s", e.rank, o.what, e.l.errString(rc))
		}
		o.postedSends = append(o.postedSends, i)
		o.nextSend++
		moved = true
	}
	return moved, nil
}

func (o *ringOp) progress(e *engine) (done, moved bool, n int, err error) {
	flag := &e.l.sc.flag
	for k := 0; k < len(o.postedRecvs); {
		i := o.postedRecvs[k]
		if rc := call(e.l.test, ptr(&o.recvReq[i]), ptr(flag), 0); rc != mpiSuccess {
			return true, true, 0, fmt.Errorf("mpi: rank %d: %s: receive failed: %s", e.rank, o.what, e.l.errString(rc))
		}
		if *flag == 0 {
			k++
			continue
		}
		m := o.recvs[i]
		if m.t < o.n-1 {
			s := o.recvSlot[i]
			acc := o.tmp[s][:(m.hi-m.lo)*o.esz]
			// acc holds ranks j+1..r−1 in order; add rank r's value last.
			add(o.dt, o.region(o.work, m.lo, m.hi), acc, o.region(o.src, m.lo, m.hi))
			o.freeSlots = append(o.freeSlots, s)
		}
		o.recvDone[i] = true
		o.nRecvDone++
		o.inflight--
		o.postedRecvs[k] = o.postedRecvs[len(o.postedRecvs)-1]
		o.postedRecvs = o.postedRecvs[:len(o.postedRecvs)-1]
		moved = true
	}
	for k := 0; k < len(o.postedSends); {
		i := o.postedSends[k]
		if rc := call(e.l.test, ptr(&o.sendReq[i]), ptr(flag), 0); rc != mpiSuccess {
			return true, true, 0, fmt.Errorf("mpi: rank %d: %s: send failed: %s", e.rank, o.what, e.l.errString(rc))
		}
		if *flag == 0 {
			k++
			continue
		}
		o.sendDone[i] = true
		o.nSendDone++
		o.postedSends[k] = o.postedSends[len(o.postedSends)-1]
		o.postedSends = o.postedSends[:len(o.postedSends)-1]
		moved = true
	}
	m, err := o.post(e)
	if err != nil {
		return true, true, 0, err
	}
	moved = moved || m
	if o.nSendDone == len(o.sends) && o.nRecvDone == len(o.recvs) {
		for _, b := range o.tmp {
			e.putTmp(b)
		}
		o.tmp = nil
		return true, true, o.bounds[o.n], nil
	}
	return false, moved, 0, nil
}
