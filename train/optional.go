package train

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Number is the type of an Optional configuration value.
type Number interface {
	~int | ~uint64 | ~float64
}

// Optional is a configuration value that may be left unset, so that an
// explicit zero differs from "not given": Config.Defaults replaces only
// unset values with the model's defaults. The zero Optional is unset; Set
// makes a set one. In JSON an Optional is its value, or null when unset
// (Config omits unset ones), so run.json reads as plain numbers.
type Optional[T Number] struct {
	v   T
	set bool
}

// Set returns an Optional holding v.
func Set[T Number](v T) Optional[T] { return Optional[T]{v: v, set: true} }

// Value returns the value, 0 when unset.
func (o Optional[T]) Value() T { return o.v }

// IsSet reports whether the value is set.
func (o Optional[T]) IsSet() bool { return o.set }

// IsZero reports whether o is unset (for encoding/json's omitzero).
func (o Optional[T]) IsZero() bool { return !o.set }

// orDefault sets o to v when o is unset.
func (o *Optional[T]) orDefault(v T) {
	if !o.set {
		*o = Set(v)
	}
}

// String writes the value, or "unset".
func (o Optional[T]) String() string {
	if !o.set {
		return "unset"
	}
	return fmt.Sprint(o.v)
}

// MarshalJSON writes the value, or null when unset.
func (o Optional[T]) MarshalJSON() ([]byte, error) {
	if !o.set {
		return []byte("null"), nil
	}
	return json.Marshal(o.v)
}

// UnmarshalJSON reads a value, or null as unset.
func (o *Optional[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*o = Optional[T]{}
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*o = Set(v)
	return nil
}
