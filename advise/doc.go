// Package advise owns the sparsifier advisor: it measures on this machine
// what it can (one training step of a model and when each of its gradients
// becomes final in the backward pass, each method's selection cost on the
// model's real layout and real gradients, the host's collectives) and
// projects each method's time per iteration at P workers on a given network
// with the α-β model of comm/netmodel, ranking the methods against dense
// all-reduce as PyTorch DDP runs it (buckets all-reduced during the
// backward pass; Setting.NoOverlap: after it).
//
// What each method sends is predicted over the run's horizon: its own
// reducer runs, with error feedback, over the horizon's steps of the
// measured or recorded gradients (Horizon), so that controllers that move
// (thresholds, warm-ups, adaptive densities) are predicted as they send,
// not at their end point. A built-in model's horizon is one epoch; on its
// gradients measured at one step, repeated, each reducer runs until it has
// settled by a stated criterion and the rest of the epoch repeats its
// settled steps (horizon.go; the table says how many steps ran). Traffic
// at a worker count the horizon did not run is each rank's plan of calls
// (sparsify.Advice.Plan), timed by rank 0's and counted in bytes as the
// workers' mean, as a run's step record has them. Where the step time stands for a GPU and this
// machine has none, the other costs come from a cost profile measured by
// this project on a GPU (CostProfile) or the advisor refuses to mix devices.
//
// It never names a method: what it knows of each is what the method's
// registry entry declares (sparsify.Method.Advice and Pipelined; see
// sparsify's "What a method declares"): the calls of one iteration (Plan,
// then CommTime and Bytes), the elements selected and sent given the
// measured overlap of the workers' selections, how the measured selection
// time scales with the workers, the schedule the measurements time (a
// period of expensive and cheap calls), the caveats, and what is known of
// its accuracy (Known, ShownFor: the kinds of model, densities and worker
// counts it was shown at). A new method is advised as soon as it is
// registered with those facts; one registered without them is refused
// with the facts it lacks. "dense" appears here only as the baseline the
// speedups are computed against.
package advise
