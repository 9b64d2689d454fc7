package sparsify

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

var updateMethodsDoc = flag.Bool("update-methods-doc", false, "rewrite the generated list of methods in doc.go")

// methodsDoc is the package documentation's list of methods, from the
// declarations: method (the file of its constructor): Doc.
func methodsDoc() string {
	var b strings.Builder
	for _, m := range Methods() {
		if strings.HasPrefix(m.Name, "zz-") {
			continue // registered by a test
		}
		file, _ := runtime.FuncForPC(reflect.ValueOf(m.New).Pointer()).FileLine(reflect.ValueOf(m.New).Pointer())
		b.WriteString(wrapComment("//   - ", "//     ", fmt.Sprintf("%q (%s): %s", m.Name, filepath.Base(file), m.Doc), 78))
	}
	return b.String()
}

// TestMethodsDoc: the package documentation lists every method as its
// declaration says (go generate ./sparsify rewrites the list), and every
// method says what it is.
func TestMethodsDoc(t *testing.T) {
	for _, m := range Methods() {
		if m.Doc == "" && !strings.HasPrefix(m.Name, "zz-") {
			t.Errorf("%s declares no Doc", m.Name)
		}
	}
	const marker = "// file): Method.Doc.\n//\n"
	const end = "//\n// Every method except gtopk"
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, marker), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("doc.go lacks the line %q before the list and %q after it", marker, end)
	}
	want := doc[:i+len(marker)] + methodsDoc() + doc[j:]
	if want == doc {
		return
	}
	if *updateMethodsDoc {
		if err := os.WriteFile("doc.go", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("doc.go's list of methods is out of date; run go generate ./sparsify. Want:\n%s", methodsDoc())
}

// groupsCore is a core of the frame tests: the whole gradient in groups
// of its choosing, each averaged densely with its all-reduce left in
// flight (Starter); it counts the finishes run.
type groupsCore struct {
	e        *Env
	groups   []Group
	finished int
}

func (c *groupsCore) Groups() []Group { return c.groups }

func (c *groupsCore) Reduce(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) error {
	finish, err := c.Start(ctx, g, acc, out, residual, st)
	if err != nil {
		return err
	}
	return finish(ctx)
}

func (c *groupsCore) Start(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) (func(context.Context) error, error) {
	gr := c.groups[g]
	v := &c.e.v
	o := out.Slice(gr.Lo, gr.Hi)
	if err := v.s.Copy(o, acc.Slice(gr.Lo, gr.Hi)); err != nil {
		return nil, err
	}
	if err := v.m.Fill(v.s, residual.Slice(gr.Lo, gr.Hi), 0); err != nil {
		return nil, err
	}
	req, err := comm.IAllReduce(ctx, c.e.c, v.cb(o))
	if err != nil {
		return nil, err
	}
	st.Selected, st.Distinct = gr.Size(), gr.Size()
	return func(ctx context.Context) error {
		c.finished++
		if _, err := req.Wait(ctx); err != nil {
			return err
		}
		return v.m.Scale(v.s, o, 1/float32(c.e.c.Size()))
	}, nil
}

// framed frames a groupsCore of groups on o's worker, as New does (the
// method is not registered: tests that range over the registry do not
// see it).
func framed(o Options, groups func(l Layout) []Group) (*Reducer, error) {
	e := newEnv(o)
	return newReducer(Method{Name: "zz-groups"}, e, &groupsCore{e: e, groups: groups(o.Layout)})
}

// TestFrameGroups: the frame combines a call's groups as one call (the
// same output, residual and statistics as a dense reduction, the bytes of
// every group), finishes every started group also when the call fails (a
// group not started, a group started twice, other vectors), and refuses
// groups that do not partition the gradient.
func TestFrameGroups(t *testing.T) {
	l, err := NewLayout([]string{"a", "b", "c"}, []int{7, 30, 5})
	if err != nil {
		t.Fatal(err)
	}
	cnt := comm.NewCounter(local.New(1).Comm(0))
	r, err := framed(Options{Density: 1, Layout: l, Comm: cnt}, func(l Layout) []Group { return LAGSGroups(l, 1) }) // [c], [b], [a]
	if err != nil {
		t.Fatal(err)
	}
	if r.e.c != cnt {
		t.Fatal("the reducer counts through a counter of its own over the caller's comm.Counter: every call would be counted twice")
	}
	d, err := New("dense", Options{Density: 1, Layout: l, Comm: local.New(1).Comm(0)})
	if err != nil {
		t.Fatal(err)
	}
	acc := make([]float32, l.N)
	genNormal(harnessRNG(3, 0, 0), acc)
	out, res, dOut, dRes := make([]float32, l.N), make([]float32, l.N), make([]float32, l.N), make([]float32, l.N)
	before := cnt.Totals()
	st, err := r.Reduce(t.Context(), acc, out, res)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := d.Reduce(t.Context(), acc, dOut, dRes)
	if err != nil {
		t.Fatal(err)
	}
	checkClose(t, "out", out, dOut, nil)
	checkClose(t, "residual", res, dRes, nil)
	if got := cnt.Totals().Sub(before); got.Calls != 3 || st.BytesSent != got.BytesSent {
		t.Errorf("%d calls counted (want one per group, 3), %d bytes; Stats says %d", got.Calls, got.BytesSent, st.BytesSent)
	}
	if st.ActualDensity != ds.ActualDensity || st.Selected != ds.Selected || st.ErrorNorm != 0 || st.Threshold == st.Threshold {
		t.Errorf("the groups' stats %+v, dense's %+v", st, ds)
	}
	core := r.core.(*groupsCore)
	h := device.Host[float32]
	for _, tc := range []struct {
		name  string
		start func() error
		want  string
	}{
		{"a group not started", func() error {
			if err := r.Start(t.Context(), 0, h(acc), h(out), h(res)); err != nil {
				return err
			}
			return r.Start(t.Context(), 2, h(acc), h(out), h(res))
		}, "group 1 was never started"},
		{"a group started twice", func() error {
			for _, g := range []int{0, 1, 2, 1} {
				if err := r.Start(t.Context(), g, h(acc), h(out), h(res)); err != nil {
					return nil // Finish reports it
				}
			}
			return nil
		}, "group 1 started twice"},
		{"other vectors", func() error {
			r.Start(t.Context(), 0, h(acc), h(out), h(res))
			r.Start(t.Context(), 1, h(acc), h(make([]float32, l.N)), h(res))
			return nil
		}, "other vectors"},
	} {
		before := core.finished
		if err := tc.start(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, err := r.Finish(t.Context())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Finish returned %v, want %q", tc.name, err, tc.want)
		}
		if core.finished == before {
			t.Errorf("%s: the started groups were not finished", tc.name)
		}
		if _, err := r.Reduce(t.Context(), acc, out, res); err != nil {
			t.Fatalf("%s: the next call: %v", tc.name, err)
		}
	}
	for _, bad := range [][]Group{
		{{Tensors: []int{2, 1, 0}, Lo: 0, Hi: 41}},
		{{Tensors: []int{2}, Lo: 37, Hi: 42}, {Tensors: []int{1, 0}, Lo: 0, Hi: 38}},
		{},
	} {
		if _, err := framed(Options{Density: 1, Layout: l, Comm: local.New(1).Comm(0)}, func(Layout) []Group { return bad }); err == nil {
			t.Errorf("groups %v accepted", bad)
		}
	}
}
