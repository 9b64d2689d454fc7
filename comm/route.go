package comm

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
)

// Route returns a communicator of host's ranks that runs each call on dev
// when its buffers are in a device's memory and on host otherwise: e.g.
// NCCL for a GPU's vectors beside MPI or the in-process backend for the
// host's (initial parameters, checkpoints, control numbers). A buffer is in
// device memory when it is a Device buffer of a device other than the CPU,
// empty ones included, so that every rank of a collective takes the same
// way whatever its share. host and dev must have the same rank and size; a
// call that mixes host and device buffers is an error.
func Route(host, dev Communicator) (Communicator, error) {
	if host.Rank() != dev.Rank() || host.Size() != dev.Size() {
		return nil, fmt.Errorf("comm: Route: the host communicator is rank %d of %d, the device one rank %d of %d", host.Rank(), host.Size(), dev.Rank(), dev.Size())
	}
	return &route{host: host, dev: dev}, nil
}

type route struct{ host, dev Communicator }

// deviceMemory reports whether b is a Device buffer of a device other than
// the CPU.
func deviceMemory(b Buffer) bool {
	d, ok := b.(Device)
	if !ok {
		return false
	}
	dev := d.Buf.Device()
	return dev != nil && dev.Kind() != device.CPUKind
}

// pick returns the communicator of a call on bufs.
func (r *route) pick(what string, bufs ...Buffer) (Communicator, error) {
	n := 0
	for _, b := range bufs {
		if deviceMemory(b) {
			n++
		}
	}
	switch n {
	case 0:
		return r.host, nil
	case len(bufs):
		return r.dev, nil
	}
	return nil, fmt.Errorf("comm: %s: the buffers are partly in host and partly in device memory; pass both in the same memory", what)
}

func (r *route) Rank() int { return r.host.Rank() }
func (r *route) Size() int { return r.host.Size() }

func (r *route) AllReduce(ctx context.Context, buf Buffer) error {
	c, _ := r.pick("AllReduce", buf)
	return c.AllReduce(ctx, buf)
}

func (r *route) AllGather(ctx context.Context, send, recv Buffer) error {
	c, err := r.pick("AllGather", send, recv)
	if err != nil {
		return err
	}
	return c.AllGather(ctx, send, recv)
}

func (r *route) AllGatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	c, err := r.pick("AllGatherV", send, recv)
	if err != nil {
		return err
	}
	return c.AllGatherV(ctx, send, recv, counts)
}

func (r *route) Broadcast(ctx context.Context, buf Buffer, root int) error {
	c, _ := r.pick("Broadcast", buf)
	return c.Broadcast(ctx, buf, root)
}

func (r *route) Send(ctx context.Context, buf Buffer, dst, tag int) error {
	c, _ := r.pick("Send", buf)
	return c.Send(ctx, buf, dst, tag)
}

func (r *route) Recv(ctx context.Context, buf Buffer, src, tag int) (int, error) {
	c, _ := r.pick("Recv", buf)
	return c.Recv(ctx, buf, src, tag)
}

func (r *route) SendRecv(ctx context.Context, send Buffer, dst int, recv Buffer, src, tag int) (int, error) {
	c, err := r.pick("SendRecv", send, recv)
	if err != nil {
		return 0, err
	}
	return c.SendRecv(ctx, send, dst, recv, src, tag)
}

// Barrier synchronizes on the host communicator.
func (r *route) Barrier(ctx context.Context) error { return r.host.Barrier(ctx) }

func (r *route) IAllReduceView(ctx context.Context, buf Buffer, off, total int) (Request, error) {
	c, _ := r.pick("IAllReduceView", buf)
	return c.IAllReduceView(ctx, buf, off, total)
}

func (r *route) IAllGather(ctx context.Context, send, recv Buffer) (Request, error) {
	c, err := r.pick("IAllGather", send, recv)
	if err != nil {
		return nil, err
	}
	return c.IAllGather(ctx, send, recv)
}

func (r *route) ISend(ctx context.Context, buf Buffer, dst, tag int) (Request, error) {
	c, _ := r.pick("ISend", buf)
	return c.ISend(ctx, buf, dst, tag)
}

func (r *route) IRecv(ctx context.Context, buf Buffer, src, tag int) (Request, error) {
	c, _ := r.pick("IRecv", buf)
	return c.IRecv(ctx, buf, src, tag)
}
