package advise

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Shape is what a method's traffic depends on (sparsify.Shape: each
// method's registry entry declares its traffic as a function of it).
type Shape = sparsify.Shape

// Call is one kind of communicator call one worker makes per iteration
// (sparsify.Call).
type Call = sparsify.Call

// Plan returns the communicator calls worker s.Rank of method makes in one
// iteration after any warm-up, as the method's reducer in package sparsify
// makes them: what the method's registry entry declares
// (sparsify.Advice.Plan; TestPlanMatchesReducers checks it against
// comm.Counter on the real reducers). Non-blocking calls count as their
// blocking op (comm.Counter does the same).
func Plan(method string, s Shape) ([]Call, error) {
	a, err := advice(method)
	if err != nil {
		return nil, err
	}
	calls, err := a.Plan(s)
	if err != nil {
		return nil, fmt.Errorf("advise: %s: %w", method, err)
	}
	return calls, nil
}

// advice returns what method's registry entry declares for the advisor.
func advice(method string) (*sparsify.Advice, error) {
	m, ok := sparsify.Lookup(method)
	if !ok {
		return nil, fmt.Errorf("advise: unknown method %q; use one of %v", method, sparsify.Names())
	}
	if miss := m.Advice.MissingModel(); len(miss) > 0 {
		return nil, fmt.Errorf("advise: no traffic model for method %q: its registry entry (sparsify.Method) does not declare %s", method, strings.Join(miss, ", "))
	}
	return m.Advice, nil
}

// CommTime is the modelled time of one iteration's calls on P workers over
// net. Point-to-point messages are charged on the receiving side only
// (links are full duplex, so a rank's sends overlap its receives): Recv and
// SendRecv cost α + m/β each, one after another; Send costs nothing.
// Collectives cost what netmodel.Network.Cost says, all-gather-v with equal
// contributions.
func CommTime(calls []Call, P int, net netmodel.Network) time.Duration {
	var total float64
	for _, cl := range calls {
		if cl.Count == 0 {
			continue
		}
		b := int64(math.Round(cl.Elems * 4))
		var one time.Duration
		switch cl.Op {
		case comm.OpSend:
			continue
		case comm.OpRecv, comm.OpSendRecv:
			one = net.PointToPoint(b)
		case comm.OpAllGatherV:
			blocks := make([]int64, P)
			for i := range blocks {
				blocks[i] = b
			}
			one = net.AllGatherVTime(blocks)
		default:
			one = net.Cost(cl.Op, P, int(b), 1, nil)
		}
		total += float64(one) * cl.Count
	}
	return time.Duration(total)
}

// rankBytes is the number of bytes worker r of P sends per iteration under
// its calls (comm.Traffic's accounting, as comm.Counter and a reducer's
// Stats.BytesSent count them).
func rankBytes(calls []Call, P, r int) float64 {
	var total float64
	for _, cl := range calls {
		e := int(math.Round(cl.Elems))
		if cl.Op == comm.OpSendRecv { // what comm.Counter counts: the message sent
			total += float64(4*e) * cl.Count
			continue
		}
		var counts []int
		if cl.Op == comm.OpAllGatherV || cl.Op == comm.OpReduceScatter {
			counts = make([]int, P)
			for i := range counts {
				counts[i] = e
			}
		}
		sent, _ := comm.Traffic(cl.Op, P, r, e, 4, 0, counts)
		total += float64(sent) * cl.Count
	}
	return total
}

// PlanBytes is the number of bytes one worker of method sends per
// iteration on the shape s, on average over the s.P workers as a run's step
// record has them: each rank's own calls (Plan with Shape.Rank; gTop-k's
// tree sends from the ranks other than 0), plus the all-reduce of the dense
// elements below a size cut-off (none when s.N is 0: every tensor is
// below it).
func PlanBytes(method string, s Shape, dense int) (float64, error) {
	var sum float64
	for r := range max(s.P, 1) {
		var calls []Call
		if s.N > 0 {
			s.Rank = r
			var err error
			if calls, err = Plan(method, s); err != nil {
				return 0, err
			}
		}
		sum += rankBytes(withDense(calls, dense), s.P, r)
	}
	return sum / float64(max(s.P, 1)), nil
}
