package netmodel_test

import (
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// A run on 4 workers made 100 dense all-reduces of 1 M float32 and, for a
// sparse method, 100 all-gathers of 10 k values per worker; how long would
// its communication take on 64 workers over 10 Gbit/s Ethernet?
func ExampleProject() {
	stats := map[comm.Op]comm.OpStats{}
	s, r := comm.Traffic(comm.OpAllReduce, 4, 0, 1<<20, 4, 0, nil)
	stats[comm.OpAllReduce] = comm.OpStats{Calls: 100, Elements: 100 << 20, BytesSent: 100 * s, BytesRecv: 100 * r}
	s, r = comm.Traffic(comm.OpAllGather, 4, 0, 10_000, 4, 0, nil)
	stats[comm.OpAllGather] = comm.OpStats{Calls: 100, Elements: 100 * 10_000, BytesSent: 100 * s, BytesRecv: 100 * r}

	for _, n := range []int{4, 64} {
		p, err := netmodel.Project(stats, 4, n, netmodel.Ethernet10G)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d workers: all-reduce %v, all-gather %v\n", n,
			p.PerOp[comm.OpAllReduce].Round(time.Millisecond), p.PerOp[comm.OpAllGather].Round(time.Millisecond))
	}
	// Output:
	// 4 workers: all-reduce 533ms, all-gather 20ms
	// 64 workers: all-reduce 1.291s, all-gather 232ms
}
