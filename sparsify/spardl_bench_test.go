package sparsify

import (
	"fmt"
	"testing"
)

func BenchmarkSparDLReduce(b *testing.B) {
	l := lagsResNet18Layout(b)
	for _, c := range []struct {
		n, teams int
		sag      string
	}{{1, 1, "bruck"}, {4, 1, "bruck"}, {4, 2, "bruck"}, {4, 2, "rsag"}} {
		b.Run(fmt.Sprintf("workers=%d/N=%d/teams=%d%s", c.n, l.N, c.teams, c.sag), func(b *testing.B) {
			lagsBenchReduce(b, "spardl", c.n, l, func(o *Options) { o.Params = Values{"teams": c.teams, "sag": c.sag} })
		})
	}
}
