package engine

import (
	"slices"

	"github.com/sparsegrad/sparsegrad/ops"
)

// A program's plan for oneDNN: which instructions oneDNN runs, the memory
// format of every value, and which instructions' work another instruction
// does.
//
// Memory formats. oneDNN's convolutions are fastest on activations whose
// channels are blocked (nChw8c with AVX2: [B][C/8][H][W][8]); converting
// between that format and NCHW at every layer costs a pass over the data
// each way. So values stay blocked between oneDNN's ops where every op that
// touches them can read them: the values form groups that must share one
// format — an elementwise op's operands and result (ReLU's gradient, the
// residual add, a gradient sum: their kernels do not care about the format
// as long as all are the same), the 4-D operands and results of one batch
// normalisation, and a value and its in-place aliases. A group is blocked
// when it has four dimensions with channels a multiple of the block, holds
// only the executor's temporaries, is read or written by a oneDNN op, and
// no other op (a reshape, a reduction, a copy into the gradient vector)
// touches it; otherwise it is NCHW, and the oneDNN ops reorder at its
// border. A convolution reads and writes any format (reordering its
// operands into the formats its kernel wants, inside its own workspace),
// and converts the weights from and the weight gradient to the caller's
// OIHW layout on every run.
//
// Merged batch normalisation. oneDNN computes a training batch's statistics
// together with the normalised output, and the gradient sums together with
// the input's gradient; the graph has one op for each half. When the second
// half directly needs the first's result and nothing reads that result (or
// the running statistics) in between, the second instruction's kernel does
// both and the first does nothing.
type dnnPlan struct {
	dnn     []bool // per instruction: runs on oneDNN
	blocked []bool // per value (by root): stored in the blocked format
	merged  []int  // per instruction: the later instruction that does its work, or −1
}

// onDNN reports whether oneDNN runs op.
func onDNN(op ops.Kernel) bool {
	switch op.(type) {
	case ops.Conv2d, ops.Conv2dGradInput, ops.Conv2dGradFilter,
		ops.BatchNormStats, ops.BatchNorm, ops.BatchNormGradSums, ops.BatchNormGradInput:
		return true
	}
	return false
}

// formatFree reports whether op's kernel reads and writes its float32
// operands of the output's shape in whatever format they share.
func formatFree(op ops.Kernel) bool {
	switch op.(type) {
	case ops.AddReLU, ops.ReLUGrad, ops.Unary, ops.Copy, ops.Binary: // a Binary's scalar operand is told apart by its shape
		return true
	}
	return false
}

func planDNN(p *Program, block int) *dnnPlan {
	n := len(p.Values)
	pl := &dnnPlan{dnn: make([]bool, len(p.Instrs)), blocked: make([]bool, n), merged: make([]int, len(p.Instrs))}
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	union := func(a, b int) { parent[find(a)] = find(b) }
	root := func(id ValueID) int { r, _ := p.Root(id); return int(r) }
	plain := make([]bool, n) // per value: must be NCHW (resolved per group below)
	touched := make([]bool, n)

	for i := range p.Values {
		v := &p.Values[i]
		if v.Kind == View {
			b := &p.Values[v.Base]
			if v.Offset != 0 || !slices.Equal(v.Shape, b.Shape) {
				plain[v.Base] = true // a reshape or slice reads the base as NCHW
			}
			continue
		}
		if v.Kind != Temp || v.Persistent || v.DType != ops.Float32 || len(v.Shape) != 4 || block == 0 || v.Shape[1]%block != 0 {
			plain[i] = true
		}
	}
	for j := range p.Instrs {
		in := &p.Instrs[j]
		out := &p.Values[in.Out]
		switch {
		case onDNN(in.Op):
			pl.dnn[j] = true
			var group []int
			for _, id := range append(append([]ValueID(nil), in.In...), in.Out) {
				if len(p.Values[id].Shape) == 4 {
					touched[root(id)] = true
					group = append(group, root(id))
				}
			}
			if isBN(in.Op) {
				for _, r := range group[1:] {
					union(r, group[0])
				}
			}
			// Weights and their gradients are read and written as OIHW.
			switch in.Op.(type) {
			case ops.Conv2d:
				plain[root(in.In[1])] = true
			case ops.Conv2dGradInput:
				plain[root(in.In[0])] = true
			case ops.Conv2dGradFilter:
				plain[root(in.Out)] = true
			}
		case formatFree(in.Op):
			for _, id := range in.In {
				if slices.Equal(p.Values[id].Shape, out.Shape) {
					union(root(id), root(in.Out))
				} else if p.Values[id].Size() != 1 {
					plain[root(id)], plain[root(in.Out)] = true, true
				}
			}
		default:
			for _, id := range in.In {
				plain[root(id)] = true
			}
			plain[root(in.Out)] = true
		}
		if in.InPlace >= 0 {
			union(root(in.In[in.InPlace]), root(in.Out))
		}
	}
	groupPlain := make([]bool, n)
	groupTouched := make([]bool, n)
	for i := range p.Values {
		if p.Values[i].Kind == View {
			continue
		}
		g := find(i)
		groupPlain[g] = groupPlain[g] || plain[i]
		groupTouched[g] = groupTouched[g] || touched[i]
	}
	for i := range p.Values {
		if p.Values[i].Kind == View {
			continue
		}
		g := find(i)
		pl.blocked[i] = !groupPlain[g] && groupTouched[g]
	}
	for i := range p.Values {
		if p.Values[i].Kind == View {
			pl.blocked[i] = pl.blocked[p.Values[i].Base]
		}
	}
	pl.planMerges(p)
	return pl
}

func isBN(op ops.Kernel) bool {
	switch op.(type) {
	case ops.BatchNormStats, ops.BatchNorm, ops.BatchNormGradSums, ops.BatchNormGradInput:
		return true
	}
	return false
}

// planMerges finds the batch normalisation pairs one kernel runs.
func (pl *dnnPlan) planMerges(p *Program) {
	for j := range pl.merged {
		pl.merged[j] = -1
	}
	root := func(id ValueID) ValueID { r, _ := p.Root(id); return r }
	// readersAfter reports whether every instruction other than k that
	// reads value v's storage runs after k.
	readersAfter := func(v ValueID, k int) bool {
		r := root(v)
		for i := 0; i < k; i++ {
			for _, id := range p.Instrs[i].In {
				if root(id) == r {
					return false
				}
			}
		}
		return true
	}
	// untouched reports whether no instruction strictly between j and k
	// reads or writes any of vs.
	untouched := func(j, k int, vs ...ValueID) bool {
		for i := j + 1; i < k; i++ {
			in := &p.Instrs[i]
			for _, v := range vs {
				if root(in.Out) == root(v) {
					return false
				}
				for _, id := range in.In {
					if root(id) == root(v) {
						return false
					}
				}
			}
		}
		return true
	}
	for j := range p.Instrs {
		if !pl.dnn[j] {
			continue
		}
		first := &p.Instrs[j]
		for k := j + 1; k < len(p.Instrs); k++ {
			second := &p.Instrs[k]
			if !pl.dnn[k] {
				continue
			}
			switch op := first.Op.(type) {
			case ops.BatchNormStats:
				bn, ok := second.Op.(ops.BatchNorm)
				if !ok || !bn.Training || second.In[3] != first.Out || second.In[0] != first.In[0] {
					continue
				}
				if readersAfter(first.Out, k) && untouched(j, k, first.Out, first.In[1], first.In[2]) {
					pl.merged[j] = k
				}
			case ops.BatchNormGradSums:
				gi, ok := second.Op.(ops.BatchNormGradInput)
				if !ok || gi.ReLU != op.ReLU || second.In[4] != first.Out || second.In[0] != first.In[0] ||
					second.In[2] != first.In[1] || second.In[3] != first.In[2] || (op.ReLU && second.In[5] != first.In[3]) {
					continue
				}
				if readersAfter(first.Out, k) && untouched(j, k, first.Out) {
					pl.merged[j] = k
				}
			}
			if pl.merged[j] >= 0 {
				break
			}
		}
	}
}
