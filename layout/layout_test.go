package layout

import (
	"reflect"
	"strings"
	"testing"
)

// TestLayout: tensors are laid out one after another with their shapes
// kept; sizes that are not positive and names and sizes of different
// lengths are refused.
func TestLayout(t *testing.T) {
	l, err := Of([]Tensor{{Name: "w", Shape: []int{2, 3}, Size: 6, Offset: 99}, {Name: "b", Size: 3}})
	want := Layout{Tensors: []Tensor{{Name: "w", Shape: []int{2, 3}, Size: 6}, {Name: "b", Offset: 6, Size: 3}}, N: 9}
	if err != nil || !reflect.DeepEqual(l, want) {
		t.Fatalf("Of = %+v, %v; want %+v", l, err, want)
	}
	if n, s := l.Names(), l.Sizes(); !reflect.DeepEqual(n, []string{"w", "b"}) || !reflect.DeepEqual(s, []int{6, 3}) {
		t.Errorf("Names %v, Sizes %v", n, s)
	}
	if f, err := Flat(5); err != nil || len(f.Tensors) != 1 || f.N != 5 || f.Tensors[0].Name != "flat" {
		t.Errorf("Flat(5) = %+v, %v", f, err)
	}
	for _, c := range []struct {
		names []string
		sizes []int
		want  string
	}{
		{[]string{"a"}, []int{1, 2}, "1 names but 2 sizes"},
		{[]string{"a", "b"}, []int{1, 0}, `tensor 1 ("b") has size 0`},
	} {
		if _, err := New(c.names, c.sizes); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%v, %v): %v, want %q", c.names, c.sizes, err, c.want)
		}
	}
}
