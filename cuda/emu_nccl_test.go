package cuda

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"

	"github.com/sparsegrad/sparsegrad/device"
)

// The emulator's NCCL: ranks of one process on emulated GPUs (the emulator
// shows emuGPUs devices, all sharing its memory). Every transfer is posted
// without blocking and completes when its peers have posted theirs and the
// work posted before it on each rank's stream has completed, so streams
// and events behave as on a GPU: the completion event of a transfer is not
// ready until every rank has issued its part, work issued after it on a
// stream that waits for it runs after it, and a rank whose peer never
// calls waits until its context ends and aborts (ncclCommAbort completes
// its transfers, as the real one makes its kernels return). Sums add the
// ranks' contributions in rank order (real NCCL uses its own order).

// emuGPUs is the number of GPUs the emulator shows.
var emuGPUs = 1

// pending is work posted on a stream that completes later.
type pending chan struct{}

// emuComm is one communicator of the fake NCCL.
type emuComm struct {
	size    int
	joined  int
	ready   chan struct{}
	mu      sync.Mutex
	seq     []int                // each rank's next collective number
	rv      map[int]*rendezvous  // collective number → contributions
	p2p     map[[2]int][]*p2pMsg // (src, dst) → sends not yet received
	waiting map[[2]int][]p2pRecv
}

type rendezvous struct {
	args []ncclArgs
	done []pending
	// prev is each rank's work posted before its part on its stream.
	prev [][]pending
	n    int
}

type ncclArgs struct {
	kind              byte // 'a' all-reduce, 'g' all-gather, 'b' broadcast
	send, recv, count uint64
	dt, root          int32
}

// p2pMsg is a send: its data, read once ready is closed.
type p2pMsg struct {
	data  []byte
	ready pending
}

type p2pRecv struct {
	buf, bytes uint64
	done       pending
	prev       []pending // the work posted before it on its stream
}

type emuRank struct {
	c    *emuComm
	rank int
	// posted is the rank's transfers, which an abort completes.
	posted []pending
}

// finishMu makes completing a transfer (finish) and aborting its rank
// exclusive.
var finishMu sync.Mutex

// finish completes p unless an abort has.
func finish(p pending) {
	finishMu.Lock()
	defer finishMu.Unlock()
	select {
	case <-p:
	default:
		close(p)
	}
}

// installNCCLFakes points the NCCL table at the fake.
func installNCCLFakes(e *emu) {
	ncclOnce.Do(func() {})
	ncclErr = nil
	var mu sync.Mutex
	comms := map[NCCLID]*emuComm{}
	ranks := map[uintptr]*emuRank{}
	// post adds a transfer of rank rk to stream s and returns it and the
	// work posted on s before it.
	post := func(rk *emuRank, s uintptr) (pending, []pending) {
		prev := e.eventPending(s)
		p := make(pending)
		e.mu.Lock()
		e.pending[s] = append(e.pending[s], p)
		e.mu.Unlock()
		mu.Lock()
		rk.posted = append(slices.DeleteFunc(rk.posted, func(q pending) bool { return allDone([]pending{q}) }), p)
		mu.Unlock()
		return p, prev
	}
	elem := func(dt int32) uint64 {
		switch dt {
		case ncclInt64, ncclFloat64:
			return 8
		case ncclFloat16:
			return 2
		}
		return 4
	}
	read := func(addr, n uint64) []byte { return e.must(4, int(n), addr, n) }
	write := func(addr uint64, b []byte) {
		if len(b) > 0 {
			e.must(3, 0, addr, uint64(len(b)), b)
		}
	}
	// sum adds b into a (rank order: a holds the ranks before b's).
	sum := func(dt int32, a, b []byte) {
		for i := 0; i < len(a); i += int(elem(dt)) {
			switch dt {
			case ncclFloat32:
				v := math.Float32frombits(binary.LittleEndian.Uint32(a[i:])) + math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
				binary.LittleEndian.PutUint32(a[i:], math.Float32bits(v))
			case ncclFloat64:
				v := math.Float64frombits(binary.LittleEndian.Uint64(a[i:])) + math.Float64frombits(binary.LittleEndian.Uint64(b[i:]))
				binary.LittleEndian.PutUint64(a[i:], math.Float64bits(v))
			case ncclFloat16: // each addition rounded to half, as a GPU's half sum
				binary.LittleEndian.PutUint16(a[i:], device.AddFloat16(binary.LittleEndian.Uint16(a[i:]), binary.LittleEndian.Uint16(b[i:])))
			case ncclInt32:
				binary.LittleEndian.PutUint32(a[i:], binary.LittleEndian.Uint32(a[i:])+binary.LittleEndian.Uint32(b[i:]))
			case ncclInt64:
				binary.LittleEndian.PutUint64(a[i:], binary.LittleEndian.Uint64(a[i:])+binary.LittleEndian.Uint64(b[i:]))
			}
		}
	}
	// run performs a complete collective (every rank's arguments present).
	run := func(args []ncclArgs) {
		a0 := args[0]
		es := elem(a0.dt)
		switch a0.kind {
		case 'a':
			total := a0.count * es
			acc := read(args[0].send, total)
			for _, a := range args[1:] {
				sum(a0.dt, acc, read(a.send, total))
			}
			for _, a := range args {
				write(a.recv, acc)
			}
		case 'g':
			n := a0.count * es
			var all []byte
			for _, a := range args {
				all = append(all, read(a.send, n)...)
			}
			for _, a := range args {
				write(a.recv, all)
			}
		case 'b':
			data := read(args[a0.root].send, a0.count*es)
			for _, a := range args {
				write(a.recv, data)
			}
		}
	}
	// collective posts rank r's part of its next collective.
	collective := func(h, s uintptr, a ncclArgs) int32 {
		mu.Lock()
		rk, ok := ranks[h]
		mu.Unlock()
		if !ok {
			return 4 // ncclInvalidArgument
		}
		if e.isCapturing(s) {
			return 5 // ncclInvalidUsage: not in graphs here
		}
		c := rk.c
		p, prev := post(rk, s)
		c.mu.Lock()
		k := c.seq[rk.rank]
		c.seq[rk.rank]++
		v := c.rv[k]
		if v == nil {
			v = &rendezvous{args: make([]ncclArgs, c.size), done: make([]pending, c.size), prev: make([][]pending, c.size)}
			c.rv[k] = v
		}
		v.args[rk.rank], v.done[rk.rank], v.prev[rk.rank] = a, p, prev
		v.n++
		complete := v.n == c.size
		if complete {
			delete(c.rv, k)
		}
		c.mu.Unlock()
		if complete {
			go func() {
				for _, prev := range v.prev {
					waitAll(prev)
				}
				run(v.args)
				for _, d := range v.done {
					finish(d)
				}
			}()
		}
		return 0
	}
	nccl.getVersion = func(v *int32) int32 { *v = 22105; return 0 }
	nccl.getUniqueID = func(id *NCCLID) int32 {
		binary.LittleEndian.PutUint64(id[:], uint64(e.handle())+1<<40)
		return 0
	}
	nccl.commInitRank = func(h *uintptr, n int32, id *NCCLID, rank int32) int32 {
		if n < 1 || rank < 0 || rank >= n {
			return 4
		}
		mu.Lock()
		c := comms[*id]
		if c == nil {
			c = &emuComm{size: int(n), ready: make(chan struct{}), seq: make([]int, n), rv: map[int]*rendezvous{},
				p2p: map[[2]int][]*p2pMsg{}, waiting: map[[2]int][]p2pRecv{}}
			comms[*id] = c
		}
		if c.size != int(n) {
			mu.Unlock()
			return 4
		}
		c.joined++
		if c.joined == c.size {
			close(c.ready)
		}
		hh := e.handle()
		ranks[hh] = &emuRank{c: c, rank: int(rank)}
		mu.Unlock()
		<-c.ready // NCCL's initialisation is collective
		*h = hh
		return 0
	}
	nccl.commDestroy = func(h uintptr) int32 {
		mu.Lock()
		delete(ranks, h)
		mu.Unlock()
		return 0
	}
	nccl.commAbort = func(h uintptr) int32 {
		mu.Lock()
		rk := ranks[h]
		delete(ranks, h)
		mu.Unlock()
		if rk != nil {
			for _, p := range rk.posted {
				finish(p)
			}
		}
		return 0
	}
	nccl.commGetAsyncError = func(_ uintptr, r *int32) int32 { *r = 0; return 0 }
	nccl.getErrorString = func(int32) *byte { return nil }
	nccl.groupStart = func() int32 { return 0 }
	nccl.groupEnd = func() int32 { return 0 }
	nccl.allReduce = func(send, recv, count uint64, dt, op int32, h, s uintptr) int32 {
		if op != ncclSum {
			return 4
		}
		return collective(h, s, ncclArgs{kind: 'a', send: send, recv: recv, count: count, dt: dt})
	}
	nccl.allGather = func(send, recv, count uint64, dt int32, h, s uintptr) int32 {
		return collective(h, s, ncclArgs{kind: 'g', send: send, recv: recv, count: count, dt: dt})
	}
	nccl.broadcast = func(send, recv, count uint64, dt, root int32, h, s uintptr) int32 {
		return collective(h, s, ncclArgs{kind: 'b', send: send, recv: recv, count: count, dt: dt, root: root})
	}
	// Point to point: a send copies its data out once the work before it
	// on its stream is done, and is then complete; a receive completes
	// when the matching send (in issue order) is there.
	deliver := func(c *emuComm, key [2]int) {
		for len(c.p2p[key]) > 0 && len(c.waiting[key]) > 0 {
			m, w := c.p2p[key][0], c.waiting[key][0]
			c.p2p[key], c.waiting[key] = c.p2p[key][1:], c.waiting[key][1:]
			go func() {
				<-m.ready
				waitAll(w.prev)
				write(w.buf, m.data[:min(uint64(len(m.data)), w.bytes)])
				finish(w.done)
			}()
		}
	}
	nccl.send = func(buf, count uint64, dt, peer int32, h, s uintptr) int32 {
		mu.Lock()
		rk := ranks[h]
		mu.Unlock()
		if rk == nil || int(peer) >= rk.c.size {
			return 4
		}
		p, prev := post(rk, s)
		m := &p2pMsg{ready: make(pending)}
		go func() {
			waitAll(prev)
			m.data = read(buf, count*elem(dt))
			close(m.ready)
			finish(p)
		}()
		c := rk.c
		c.mu.Lock()
		key := [2]int{rk.rank, int(peer)}
		c.p2p[key] = append(c.p2p[key], m)
		deliver(c, key)
		c.mu.Unlock()
		return 0
	}
	nccl.recv = func(buf, count uint64, dt, peer int32, h, s uintptr) int32 {
		mu.Lock()
		rk := ranks[h]
		mu.Unlock()
		if rk == nil || int(peer) >= rk.c.size {
			return 4
		}
		c := rk.c
		p, prev := post(rk, s)
		c.mu.Lock()
		key := [2]int{int(peer), rk.rank}
		c.waiting[key] = append(c.waiting[key], p2pRecv{buf: buf, bytes: count * elem(dt), done: p, prev: prev})
		deliver(c, key)
		c.mu.Unlock()
		return 0
	}
}

// eventPending is what an event recorded on stream s waits for: the work
// posted there that has not completed.
func (e *emu) eventPending(s uintptr) []pending {
	e.mu.Lock()
	defer e.mu.Unlock()
	var open []pending
	for _, p := range e.pending[s] {
		select {
		case <-p:
		default:
			open = append(open, p)
		}
	}
	e.pending[s] = open
	return append([]pending(nil), open...)
}

func allDone(ps []pending) bool {
	for _, p := range ps {
		select {
		case <-p:
		default:
			return false
		}
	}
	return true
}

func waitAll(ps []pending) {
	for _, p := range ps {
		<-p
	}
}
