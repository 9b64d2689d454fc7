package sparsify

import (
	"fmt"
	"testing"
)

func BenchmarkSparDLReduce(b *testing.B) {
	l := lagsResNet18Layout(b)
	for _, c := range []struct {
		teams int
		sag   string
	}{{1, ""}, {2, "bruck"}, {2, "rsag"}} {
		b.Run(fmt.Sprintf("workers=4/N=%d/teams=%d%s", l.N, c.teams, c.sag), func(b *testing.B) {
			lagsBenchReduce(b, "spardl", 4, l, func(o *Options) { o.Teams, o.SAG = c.teams, c.sag })
		})
	}
}
