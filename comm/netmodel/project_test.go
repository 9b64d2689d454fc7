package netmodel_test

import (
	"context"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// TestProjectRecordedRun records a real run's statistics with comm.Counter on
// the in-process backend and checks the projection against the formulas
// written out by hand.
func TestProjectRecordedRun(t *testing.T) {
	const from = 4
	stats := make([]map[comm.Op]comm.OpStats, from)
	err := local.Run(context.Background(), from, func(ctx context.Context, c comm.Communicator) error {
		cnt := comm.NewCounter(c)
		for range 3 { // dense gradient: 1000 float32
			if err := cnt.AllReduce(ctx, make(comm.Float32s, 1000)); err != nil {
				return err
			}
		}
		for range 2 { // sparse: 10 int64 indices per rank
			if err := cnt.AllGather(ctx, make(comm.Int64s, 10), make(comm.Int64s, 10*from)); err != nil {
				return err
			}
		}
		counts := []int{25, 25, 25, 25}
		if err := cnt.AllGatherV(ctx, make(comm.Float32s, 25), make(comm.Float32s, 100), counts); err != nil {
			return err
		}
		if err := cnt.Broadcast(ctx, make(comm.Float32s, 500), 0); err != nil {
			return err
		}
		s := make(map[comm.Op]comm.OpStats)
		for _, op := range comm.Ops() {
			s[op] = cnt.Stats(op)
		}
		stats[c.Rank()] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	net := netmodel.Network{Latency: 10 * time.Microsecond, Bandwidth: 1e9}
	const us = time.Microsecond
	for _, to := range []int{1, 2, 16, 64, 256} {
		// Hand-written: α = 10 µs, 1 byte = 1 ns, lg = ⌈log2 to⌉.
		lg := 0
		for 1<<lg < to {
			lg++
		}
		k := time.Duration(to - 1)
		var want time.Duration
		if to > 1 {
			ring := 2*k*10*us + time.Duration(2*float64(to-1)/float64(to)*4000)*time.Nanosecond
			steps := lg
			if to&(to-1) != 0 {
				steps = lg - 1 + 2
			}
			rd := time.Duration(steps) * (10*us + 4000*time.Nanosecond)
			want += 3 * min(ring, rd)
			// all-gather of 80 bytes per rank: Bruck beats ring for to > 2.
			agRing := k * (10*us + 80*time.Nanosecond)
			agBruck := time.Duration(lg)*10*us + k*80*time.Nanosecond
			want += 2 * min(agRing, agBruck)
			// all-gather-v of 100 bytes per rank
			want += min(k*(10*us+100*time.Nanosecond), time.Duration(lg)*10*us+k*100*time.Nanosecond)
			// broadcast of 2000 bytes
			bin := time.Duration(lg) * (10*us + 2000*time.Nanosecond)
			sag := time.Duration(lg+to-1)*10*us + time.Duration(2*float64(to-1)/float64(to)*2000)*time.Nanosecond
			want += min(bin, sag)
		}
		for r := range from {
			p, err := netmodel.Project(stats[r], from, to, net)
			if err != nil {
				t.Fatal(err)
			}
			if d := p.Total - want; d < -10 || d > 10 { // rounding of ns per term
				t.Errorf("to=%d rank %d: projected %v, hand-computed %v (per op %v)", to, r, p.Total, want, p.PerOp)
			}
		}
	}
}

// TestProjectScaling checks the documented n-dependence: all-gather time
// grows linearly with n, ring all-reduce time saturates.
func TestProjectScaling(t *testing.T) {
	net := netmodel.Network{Latency: 0, Bandwidth: 1e9, AllReduce: netmodel.Ring}
	ar := map[comm.Op]comm.OpStats{comm.OpAllReduce: {Calls: 1, Elements: 1e6}}
	ag := map[comm.Op]comm.OpStats{comm.OpAllGather: {Calls: 1, Elements: 1e4}}
	p16, _ := netmodel.Project(ar, 1, 16, net)
	p256, _ := netmodel.Project(ar, 1, 256, net)
	if p16.Total != time.Duration(2*15.0/16*4e6) || p256.Total != time.Duration(2*255.0/256*4e6) {
		t.Fatalf("all-reduce: %v at 16, %v at 256", p16.Total, p256.Total)
	}
	g16, _ := netmodel.Project(ag, 1, 16, net)
	g256, _ := netmodel.Project(ag, 1, 256, net)
	if g16.Total != 15*40_000 || g256.Total != 255*40_000 {
		t.Fatalf("all-gather: %v at 16, %v at 256", g16.Total, g256.Total)
	}
}
