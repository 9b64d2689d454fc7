package models

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
)

// Stateful is implemented by the models that carry state from one training
// step to the next besides their buffers: the dropout stream of NCF and the
// LSTM, and the LSTM's hidden state. Checkpoints save it per worker so that
// a resumed run draws the same dropout masks and continues the same hidden
// state as an uninterrupted one. ResNet-18 keeps no such state (its
// BatchNorm statistics are buffers).
type Stateful interface {
	// SaveState returns the state, copied to host memory.
	SaveState() ([]byte, error)
	// LoadState restores what SaveState returned into a model built with
	// the same configuration; a state of another model or size is an error
	// and changes nothing.
	LoadState(b []byte) error
}

var (
	_ Stateful = (*NCF)(nil)
	_ Stateful = (*LSTM)(nil)
)

// The dropout stream's state is its PCG's binary form, length-prefixed.

func (d *dropoutRNG) appendState(b []byte) ([]byte, error) {
	s, err := d.src.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...), nil
}

// readState restores the stream from the front of b and returns the rest,
// changing nothing on an error.
func (d *dropoutRNG) readState(b []byte) ([]byte, error) {
	if len(b) < 4 || uint64(len(b)-4) < uint64(binary.LittleEndian.Uint32(b)) {
		return nil, fmt.Errorf("models: dropout state truncated")
	}
	n := int(binary.LittleEndian.Uint32(b))
	var p = *d.src
	if err := p.UnmarshalBinary(b[4 : 4+n]); err != nil {
		return nil, fmt.Errorf("models: dropout state: %w", err)
	}
	*d.src = p
	return b[4+n:], nil
}

// SaveState implements Stateful: the dropout stream.
func (m *NCF) SaveState() ([]byte, error) { return m.drop.appendState(nil) }

// LoadState implements Stateful.
func (m *NCF) LoadState(b []byte) error {
	saved := *m.drop.src
	rest, err := m.drop.readState(b)
	if err == nil && len(rest) != 0 {
		*m.drop.src = saved
		err = fmt.Errorf("models: NCF state has %d bytes too many (a state of another model?)", len(rest))
	}
	return err
}

// SaveState implements Stateful: the dropout stream, then the training
// hidden state (h, c of every layer) as float32s.
func (m *LSTM) SaveState() ([]byte, error) {
	b, err := m.drop.appendState(nil)
	if err != nil {
		return nil, err
	}
	s := m.train.Stream()
	for i := 0; i < 2*m.cfg.Layers; i++ {
		in := m.train.Input(lstmState + i)
		h := make([]float32, in.Len())
		if err := s.Copy(device.Host(h), in); err != nil {
			return nil, err
		}
		if err := s.Synchronize(); err != nil {
			return nil, err
		}
		for _, v := range h {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b, nil
}

// LoadState implements Stateful.
func (m *LSTM) LoadState(b []byte) error {
	saved := *m.drop.src
	rest, err := m.drop.readState(b)
	if err != nil {
		return err
	}
	want := 0
	for i := 0; i < 2*m.cfg.Layers; i++ {
		want += 4 * m.train.Input(lstmState+i).Len()
	}
	if len(rest) != want {
		*m.drop.src = saved
		return fmt.Errorf("models: LSTM hidden state of %d bytes, this model's has %d (a state of another preset or batch size?)", len(rest), want)
	}
	s := m.train.Stream()
	for i := 0; i < 2*m.cfg.Layers; i++ {
		in := m.train.Input(lstmState + i)
		h := make([]float32, in.Len())
		for j := range h {
			h[j] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*j:]))
		}
		rest = rest[4*len(h):]
		if err := s.Copy(in, device.Host(h)); err != nil {
			return err
		}
	}
	return s.Synchronize()
}
