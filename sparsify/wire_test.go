package sparsify

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// dtypeSpy is a Communicator that records the element type of every buffer
// handed to a call that moves data (gathers, broadcasts, point-to-point) and
// forwards every call. Reductions (AllReduce, ReduceScatter) are not
// recorded: they sum numbers, such as int64 control sums, rather than carry
// index lists.
type dtypeSpy struct {
	comm.Communicator
	mu   sync.Mutex
	seen map[comm.DType]int
}

func (s *dtypeSpy) note(bufs ...comm.Buffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[comm.DType]int{}
	}
	for _, b := range bufs {
		s.seen[b.DType()]++
	}
}

func (s *dtypeSpy) AllGather(ctx context.Context, a, b comm.Buffer) error {
	s.note(a, b)
	return s.Communicator.AllGather(ctx, a, b)
}
func (s *dtypeSpy) AllGatherV(ctx context.Context, a, b comm.Buffer, counts []int) error {
	s.note(a, b)
	return s.Communicator.AllGatherV(ctx, a, b, counts)
}
func (s *dtypeSpy) Broadcast(ctx context.Context, b comm.Buffer, root int) error {
	s.note(b)
	return s.Communicator.Broadcast(ctx, b, root)
}
func (s *dtypeSpy) Send(ctx context.Context, b comm.Buffer, dst, tag int) error {
	s.note(b)
	return s.Communicator.Send(ctx, b, dst, tag)
}
func (s *dtypeSpy) Recv(ctx context.Context, b comm.Buffer, src, tag int) (int, error) {
	s.note(b)
	return s.Communicator.Recv(ctx, b, src, tag)
}
func (s *dtypeSpy) SendRecv(ctx context.Context, a comm.Buffer, dst int, b comm.Buffer, src, tag int) (int, error) {
	s.note(a, b)
	return s.Communicator.SendRecv(ctx, a, dst, b, src, tag)
}
func (s *dtypeSpy) IAllGather(ctx context.Context, a, b comm.Buffer) (comm.Request, error) {
	s.note(a, b)
	return s.Communicator.IAllGather(ctx, a, b)
}
func (s *dtypeSpy) ISend(ctx context.Context, b comm.Buffer, dst, tag int) (comm.Request, error) {
	s.note(b)
	return s.Communicator.ISend(ctx, b, dst, tag)
}
func (s *dtypeSpy) IRecv(ctx context.Context, b comm.Buffer, src, tag int) (comm.Request, error) {
	s.note(b)
	return s.Communicator.IRecv(ctx, b, src, tag)
}

// TestWireFormatAndMeasuredBytes runs every registered method with a meter
// (a comm.Counter) between the reducer and the backend and checks the one
// wire format of sparse data (int32 indices and counts, float32 values: no
// other type is gathered, broadcast or sent) and that every call's Stats bytes are exactly
// the bytes of the calls the reducer made (comm.Traffic of the real
// buffers), never a formula of what they should have been. LAGS is also
// checked group by group through StartGroup.
func TestWireFormatAndMeasuredBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	layout, err := NewLayout([]string{"a", "b", "c", "d", "e"}, []int{1, 700, 45, 2001, 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Names() {
		for _, n := range []int{1, 3, 4} {
			for _, d := range []float64{0.01, 0.2} {
				t.Run(fmt.Sprintf("%s/n=%d/rho=%g", name, n, d), func(t *testing.T) {
					if name == "gtopk" && n&(n-1) != 0 {
						t.Skip("gTop-k needs a power-of-two number of workers")
					}
					spies := make([]*dtypeSpy, n)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					seed := rng.Uint64()
					err := local.Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
						spy := &dtypeSpy{Communicator: c}
						spies[c.Rank()] = spy
						meter := comm.NewCounter(spy)
						m, _ := Lookup(name)
						// The reducer counts its traffic itself (a
						// communicator that hides the meter's totals).
						o := Options{Density: d, Layout: layout, Comm: struct{ comm.Communicator }{meter}, Seed: seed,
							Params: m.Applicable(Values{"min_tensor": 0, "dense_warmup": 0, "merge_size": 500})}
						r, err := New(name, o)
						if err != nil {
							return err
						}
						N := layout.N
						acc := make([]float32, N)
						out := make([]float32, N)
						for it := range 3 {
							genNormal(harnessRNG(seed, it, c.Rank()), acc)
							before := meter.Totals()
							st, err := r.Reduce(ctx, acc, out, make([]float32, N))
							if err != nil {
								return err
							}
							got := meter.Totals().Sub(before)
							if st.BytesSent != got.BytesSent || st.BytesRecv != got.BytesRecv {
								return fmt.Errorf("rank %d iteration %d: Stats bytes %d/%d, the calls made moved %d/%d", c.Rank(), it, st.BytesSent, st.BytesRecv, got.BytesSent, got.BytesRecv)
							}
						}
						if len(r.Groups()) == 1 {
							return nil
						}
						// Every group in flight at once, then finished.
						before := meter.Totals()
						res := make([]float32, N)
						for g := range r.Groups() {
							if err := r.Start(ctx, g, device.Host(acc), device.Host(out), device.Host(res)); err != nil {
								return err
							}
						}
						st, err := r.Finish(ctx)
						if err != nil {
							return err
						}
						got := meter.Totals().Sub(before)
						if st.BytesSent != got.BytesSent || st.BytesRecv != got.BytesRecv {
							return fmt.Errorf("rank %d: the groups' bytes sum to %d/%d, the calls made moved %d/%d", c.Rank(), st.BytesSent, st.BytesRecv, got.BytesSent, got.BytesRecv)
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					for r, s := range spies {
						for dt, calls := range s.seen {
							if dt != comm.Int32 && dt != comm.Float32 {
								t.Errorf("rank %d handed %d %s buffers to gathers, broadcasts or point-to-point calls; sparse data travels as int32 indices and counts and float32 values", r, calls, dt)
							}
						}
					}
				})
			}
		}
	}
}
