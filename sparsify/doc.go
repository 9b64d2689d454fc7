// Package sparsify owns the gradient sparsification methods: the flat-gradient
// Layout, the error-feedback Memory, the selection primitives (exact TopK,
// SelectAbove, KthLargestAbs, RandomK), and one Reducer per method that turns
// a worker's error-compensated gradient acc into the gradient averaged over
// the workers (out) and the worker's new residual, over a comm.Communicator.
// A registry maps method names to their declarations (Method: constructor
// and options; Register, Lookup, Methods): New(name, Options) checks the
// options every method shares and the method's own options (Options.Params)
// and builds the reducer; Names lists the methods. A method's declaration
// also carries what other packages ask about it, so that none of them
// names a method (see "What a method declares").
//
// # Devices
//
// The reducers' passes over whole vectors go through Ops, with the CPU's
// implementation here (CPUOps) and a GPU's in package cuda. A reducer that
// implements DeviceReducer (and, for LAGS, DeviceGroupReducer) reduces
// vectors in the memory of its device (Options.Stream and Options.Ops) with
// ReduceOn, exchanging comm.Device buffers, with only counts and a few
// numbers per tensor coming back to the host; its Reduce of host slices is
// the same code over host memory. On the same inputs a GPU gives the same
// index sets and the same bits as the CPU, wherever the communicator adds
// in package comm's canonical order. Every method does.
//
// # Methods
//
// Every method follows its authors' code as described in the project's
// reference notes (docs/reference-behaviour.md in the repository, section
// given below).
// Its full description (k, wire format, bytes, Stats fields) and every
// deliberate deviation are in the doc comment of its reducer type, in the
// file named below; the deviations are summarised here. Common to all: the
// budget is BudgetK, ⌊ρN⌋ clamped to at least 1 (the reference code crashes
// or sends nothing when it rounds to 0), top-k ties go to lower indices (the
// reference leaves them unspecified), the sums are added in rank order or
// the communicator's canonical order so every rank gets bit-identical
// results, and sparse data has one wire format (at most math.MaxInt32
// elements): indices and counts as int32, values as float32, lists unpadded
// (AllGatherV); where the reference code sends int64 counts and index lists
// padded to the largest count (topk, threshold, cltk, micro, deft) or packs
// indices into floats, the bytes here are those of the int32 format, so byte
// charts compare methods, not encodings. Stats' byte counts are modelled
// from each call's real sizes: the buffers each call actually hands to the
// communicator are counted (comm.Counter) with their collective's traffic
// rule (comm.Traffic: the bytes a ring or tree algorithm moves for those
// sizes, whatever the backend does internally), in the frame every single-shot reducer's
// ReduceOn runs in (base.call in shared.go: the vectors checked, the
// traffic counted, the error norm); LAGS counts per layer group.
// The average is the float32 sum times 1/n for every method but lags,
// spardl, topkdsa and oktopk (which divide by n, as their references do):
// where the reference divides (section 1's "sum / n"), the result can differ
// in the last bit when n is not a power of two.
//
//   - "dense" (dense.go, denseReducer): all-reduce average of acc; residual 0.
//     No deviation.
//   - "topk" (topk.go, topkReducer; notes 7.1): each worker's exact top-k,
//     index lists all-gathered, the union all-reduced. No other deviation.
//   - "topka" (topk.go, topkaReducer; notes 7.2, 7.8): TopkA of Ok-Topk, the
//     DEFT/MiCRO code's CLI "gtopk": all-gather of k (value, index) pairs per
//     worker. Deviations: indices as int32 (the DEFT/MiCRO copy sends int64);
//     Ok-Topk's dense warm-up is left to the trainer.
//   - "topkdsa" (topkdsa.go, topkDSAReducer; notes 7.8): TopkDSA of the
//     Ok-Topk code (SparDL's TopDSA baseline): top-k sent to the owners of P
//     contiguous regions, owners sum, sparse or dense all-gather of the sums;
//     dense warm-up (option dense_warmup, default 512). Deviations (fixes): the
//     k selected elements are the ones sent (the reference sends only |acc|
//     strictly above the k-th largest yet zeroes all k in the residual, so
//     with k = 1 it sends nothing); the last region takes N − (P−1)⌊N/P⌋
//     elements (the reference's remainder is wrong for N mod P >= ⌊N/P⌋ and
//     divides by zero for N < P); indices travel as int32, not as float32
//     (exact only below 2^24); regions cut the layout order, not the
//     reversed parameter order.
//   - "oktopk" (oktopk.go, okTopkReducer; notes 7.8): Ok-Topk: local
//     threshold exact every 32 sparse calls and otherwise reused and raised,
//     regions re-balanced every 64, owners sum, global threshold exact every
//     32 and otherwise adapted, residual zeroed only where sent and globally
//     selected; dense warm-up (option dense_warmup, default 512). Deviations
//     (fixes): the schedule counts from the end of the warm-up (the same for
//     the reference's 512); boundary proposals summed as int64 (the
//     reference's int32 overflows once P·N > 2^31); a worker with nothing
//     selected proposes the equal split and an empty global candidate set
//     keeps the global threshold (the reference crashes on both); indices
//     travel as int32, not as float32; layout order as for topkdsa.
//   - "threshold" (threshold.go, thresholdReducer; notes 7.5): |acc| >= λ
//     (default 1/(2√k)), union all-reduced. Deviation: λ is rounded to
//     float32 once and reported as such.
//   - "cltk" (cltk.go, cltkReducer; notes 7.3): CLT-k, a rotating leader's
//     top-k indices broadcast, every worker's values there all-reduced. No
//     other deviation.
//   - "gtopk" (gtopk.go, gtopkReducer; notes 7.7): Shi et al.'s gTop-k tree
//     merge, power-of-two worker counts. Deviations: indices and values as
//     two messages (int32, float32) instead of indices packed as float32
//     (exact only below 2^24); merged candidates have distinct indices.
//   - "randomk" (randomk.go, randomkReducer): k random indices shared by all
//     ranks (seeded), no indices on the wire. Baseline without a reference.
//   - "dgc" (dgc.go, dgcReducer; notes 7.4): Deep Gradient Compression:
//     per-tensor double sampling of the tensors of more than one dimension
//     (1-D tensors all-reduced dense), momentum correction with
//     momentum-factor masking (Options.Momentum, the optimizer's, which
//     then applies momentum to weight decay only), the density warm-up over
//     the first epochs (EpochScheduled), local clipping scaled by 1/√n
//     (Method.ScaledClip, the trainer's), sparse all-gather. Deviations: the
//     samples' random start is seeded per rank, iteration and tensor; the
//     warm-up is the paper's 0.25^(e+1) (the reference's configuration
//     ramps with ρ^(1/(E+1))).
//   - "dragonn" (dragonn.go, dragonnReducer; notes 6): DRAGONN's sampled
//     threshold with the threshold test and the hashed insertion fused into
//     one pass (Ops.HashSelectAbove; no compaction of the candidates), small
//     tensors dense, dense warm-up. Deviations (fixes): values are summed
//     and divided by the number of workers (the reference overwrites and
//     does not divide); error feedback is always on; element 0 can be
//     selected; exact zeros never are (a zero sampled threshold flooded the
//     slots with zeros); hash collisions resolve deterministically (highest
//     index wins); ns and nsel are at least 1. Not implemented: the paper's
//     cost model (its eq. 1) for which tensors to compress (a fixed
//     min_tensor cut-off, the reference's) and the momentum-corrected error
//     feedback the paper evaluated every method with.
//   - "deft" (deft.go, newDeft; notes 2): DEFT's fragments, norm-proportional
//     per-fragment budgets and LPT bin packing by a rotating leader.
//     The budgets follow the authors' greedy rule (descending norm, each
//     fragment max(1, ⌊remain_k·norm/remain_norm⌋) capped at its size; the
//     total can end a little below or above k). Deviations: that share is
//     computed exactly, where the reference's floating-point remain_norm can
//     floor a share of 3 to 2; empty fragments (N < n² only) get no budget
//     instead of crashing; a NaN or infinite acc is an error.
//   - "micro" (micro.go, newMicro; notes 3): MiCRO's rotating disjoint
//     partitions with a shared threshold controller. Deviations: with one
//     worker the global count is recorded as with many (the reference's
//     threshold decays every call); empty partitions (N < n) are guarded.
//   - "lags" (lags.go, LAGS; notes 5): per merge group
//     top-k and all-gathers, pipelined through GroupReducer, optional
//     adaptive density (eq. 19 with c_u an upper bound on the compression,
//     as the paper's text says: densities in [1/c_u, 1]; the formula as
//     printed makes it a lower bound). Deviations: a group's elements are
//     taken in layout order (the reference concatenates them in backward
//     order: only tie order differs); when no ratio hides the
//     communication, 1/c_u is used.
//   - "spardl" (spardl.go, spardlReducer; notes 4): sparse
//     reduce-scatter within teams, B-SAG or R-SAG across teams, Bruck
//     all-gather, global residual collection. Deviations: the flat vector is
//     blocked in layout order (the reference reverses the parameters); R-SAG
//     keeps 1/2^(s+1) of a value dropped in round s (the paper's half in
//     round 0), which conserves the gradient.
//
// Every method except gtopk and dgc with momentum correction conserves the
// gradient: Σ_w residual_w + n·out =
// Σ_w acc_w up to float32 rounding.
//
// # What a method declares
//
// Each method's file registers one Method, beside its reducer, with
// everything other packages need to know about it:
//
//   - New and Params: its constructor and its options (see "Method
//     options" below); CheckWorkers, the worker counts it refuses.
//   - CorrectsMomentum and ScaledClip: what the trainer does differently
//     around it (DGC).
//   - Projectable or NotProjectable: whether its measured traffic carries
//     over to other worker counts (the reports' projection chart, or the
//     reason they give for leaving it out).
//   - Pipelined: its reducer reduces layer groups during the backward pass
//     (DeviceGroupReducer; LAGS): the trainer pipelines it by default, the
//     reports list the pipeline option, the advisor hides its selection and
//     communication behind the backward pass.
//   - Advice (advice.go): the advisor's model of it (package advise):
//     Plan, the communicator calls of one iteration; Volume, the elements
//     one worker selects and the union that crosses the wire, given how the
//     workers' selections overlap; Selection, how its selection time scales
//     with the workers; Period, a schedule of expensive and cheap calls
//     (Ok-Topk's 32); Caveats, where the prediction is weak; Evidence, what
//     papers and the project's runs show of its accuracy, by kind of model.
//
// TestEveryMethodAdvises fails, naming the method and the field, for a
// method whose Advice lacks one; TestPipelinedMethodsReduceGroups checks
// Pipelined against the reducer; the advisor's TestPlanMatchesReducers
// checks each Plan against the real reducer's communicator calls. Tests in
// cmd/train, advise and reports register a method of their own and show
// the trainer, the advisor and the reports handle it without a change.
//
// # Method options
//
// Each method declares its own options once, beside its reducer, in the
// Method it registers (Params, options.Option: key, kind, default, valid
// values, doc). Options.Params holds them by key; New fills in the defaults
// of absent ones and refuses options the method does not declare and values
// outside their range (NaN and ±Inf included). The trainer (package train,
// command train) derives its flags, help text and configuration checks from
// the same declarations, so adding a method with options touches only the
// method's file and its tests. dense_warmup is one option shared by dragonn,
// oktopk and topkdsa, each with its own default: it means the same for the
// three (dense all-reduce iterations before sparsifying), and a run uses one
// method, so one flag, -dense-warmup, sets the warm-up of whichever runs
// (Register refuses declarations of one key that differ but by default).
//
// The list below is generated from the declarations (go generate
// ./sparsify; TestOptionsDoc fails when it is out of date); each entry is
// method: name (trainer flag), kind, valid values, default, meaning.
//
//   - dgc: sparsity_warmup (-sparsity-warmup), int, in [0, 1000] (0: none),
//     default 4: epochs of DGC's density warm-up, at most 1000: density
//     max(0.25^(e+1), ρ) in epoch e.
//   - dragonn: min_tensor (-min-tensor), int, in [0, 2147483647] (0: every
//     tensor), default 204800: compress only tensors with more elements.
//   - dragonn: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 200: dense all-reduce iterations before sparsifying.
//   - lags: merge_size (-merge-size), int, in [1, 2147483647], default 8192:
//     merge threshold in elements (1: one group per tensor).
//   - lags: max_ratio (-max-ratio), float, 0 (off) or >= 1, default 0: upper
//     bound c_u >= 1 on the compression ratio of the adaptive per-group
//     density (densities in [1/c_u, 1]).
//   - oktopk: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 512: dense all-reduce iterations before sparsifying.
//   - spardl: teams (-teams), int, in [1, 2147483647], default 1: number of
//     teams G (must divide the number of workers).
//   - spardl: sag (-sag), string, bruck or rsag, default bruck:
//     spar-all-gather across teams: bruck (B-SAG) or rsag (recursive
//     doubling, R-SAG; a power-of-two number of teams).
//   - threshold: lambda (-lambda), float, in [0, 3.4028234663852886e+38] (0:
//     1/(2√k), recomputed every call), default 0: hard threshold λ: every
//     element with |acc| >= λ is sent.
//   - topkdsa: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 512: dense all-reduce iterations before sparsifying.
package sparsify

//go:generate go test -run ^TestOptionsDoc$ -update-options-doc .
