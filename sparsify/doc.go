// Package sparsify owns the gradient sparsification methods: the flat-gradient
// Layout, the error-feedback Memory, the selection primitives (exact TopK,
// SelectAbove, KthLargestAbs, RandomK), the registry of methods, and the
// frame every method runs in. A method declares its core (Core: its own
// work, on the groups of the gradient, on one worker) and its facts in one
// Method, in its own file (Register). New(name, Options) checks the options
// every method shares and the method's own (Options.Params), builds the
// method's core and frames it: the Reducer, which turns a worker's
// error-compensated gradient acc into the gradient averaged over the
// workers (out) and the worker's new residual, over a comm.Communicator.
// The frame does, once for every method, what every method needs: the
// argument checks, the traffic counted (once: on the caller's
// comm.Counter when Options.Comm is one), the residual's error norm, the
// statistics of a call's groups combined, Reduce of host slices, the dense
// warm-up (Method.DenseWarmup), the name, and the header of the state a
// checkpoint keeps (Reducer.State). A method's declaration also carries
// what other packages ask about it, so that none of them names a method
// (see "What a method declares").
//
// # Groups
//
// Every core reduces a group of the gradient: the whole gradient is one
// group, unless the core declares several (Grouped; dense's buckets,
// LAGS' merge groups). A caller may start each group as soon as its
// gradients are final (Reducer.Start: the trainer does so during the
// backward pass for a method that declares itself Pipelined) and then
// finish the call (Reducer.Finish); ReduceOn starts every group at once
// and finishes. A core that can leave a group's communication in flight
// (Starter) returns the rest of its work to the frame, which completes it
// in Finish; one that can start several groups at once (SetStarter: LAGS,
// in fewer passes and collectives) does so for the groups a caller hands
// over together (Reducer.StartGroups: those that became ready together).
//
// Which methods overlap the backward pass, and why: dense (PyTorch DDP's
// buckets, DenseBuckets, each all-reduced as a view of the flat gradient
// in the order one all-reduce of the whole gradient sums it, so its bits
// do not depend on the overlap) and lags (its merge groups, each selected
// on its own). The others select over the whole gradient (a global top-k,
// threshold or budget: topk, topka, deft, micro, oktopk, gtopk, spardl,
// …) or cut it into ranges that do not follow the layers, so their
// reduction cannot start before the backward pass has ended; the trainer
// refuses -overlap on for them.
//
// # Devices
//
// The cores' passes over whole vectors go through Ops, with the CPU's
// implementation here (CPUOps) and a GPU's in package cuda. Ops holds the
// generic primitives; a method's own operations are kernels declared beside
// the method (device.Kernel: CUDA C embedded from a .cu file beside the
// method's, and the same pass in Go; Method.Kernels), run through Ops.Run.
// A reducer reduces vectors in the memory of its device (Options.Stream and
// Options.Ops) with ReduceOn, exchanging comm.Device buffers, with only
// counts and a few numbers per tensor coming back to the host; its Reduce
// of host slices is the same code over host memory. On the same inputs a
// GPU gives the same index sets and the same bits as the CPU, wherever the
// communicator adds in package comm's canonical order. Every method does.
//
// # Methods
//
// Every method follows its authors' code as described in the project's
// reference notes (docs/reference-behaviour.md in the repository, section
// given below). Its full description (k, wire format, bytes, Stats fields)
// and every deliberate deviation are in the doc comment of its core type,
// in the file named below; the deviations are summarised in its
// declaration (Method.Doc), which the list below repeats. Common to all: the
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
// sizes, whatever the backend does internally), by the frame, over all of
// a call's groups.
// The average is the float32 sum times 1/n for every method but lags,
// spardl, topkdsa and oktopk (which divide by n, as their references do):
// where the reference divides (section 1's "sum / n"), the result can differ
// in the last bit when n is not a power of two.
//
// The list below is generated from the declarations (go generate
// ./sparsify; TestMethodsDoc fails when it is out of date): method (its
// file): Method.Doc.
//
//   - "cltk" (cltk.go): reference notes 7.3: CLT-k, a rotating leader's top-k
//     indices broadcast, every worker's values there all-reduced. No other
//     deviation.
//   - "deft" (deft.go): reference notes 2: DEFT's fragments,
//     norm-proportional per-fragment budgets and LPT bin packing by a
//     rotating leader. The budgets follow the authors' greedy rule
//     (descending norm, each fragment max(1, ⌊remain_k·norm/remain_norm⌋)
//     capped at its size; the total can end a little below or above k).
//     Deviations: that share is computed exactly, where the reference's
//     floating-point remain_norm can floor a share of 3 to 2; empty fragments
//     (N < n² only) get no budget instead of crashing; a NaN or infinite acc
//     is an error; the leader broadcasts its fragments' norms, not its bins,
//     and every worker packs the leader's bins from them (the same bins, one
//     broadcast instead of two). The plan (norms, allocations, bins, this
//     worker's bin) is made on the device where acc lives, by one kernel on a
//     GPU (the shares exact there too), by the same Go code on the CPU; the
//     host reads only its counts.
//   - "dense" (dense.go): all-reduce average of acc; residual 0. The gradient
//     is all-reduced in buckets (DenseBuckets: PyTorch DDP's, the first 1
//     MiB, then at most bucket_mb) in the order the backward pass finishes
//     them, each bucket a view of the flat gradient started as soon as its
//     last tensor is final (overlapped with the backward pass; the trainer's
//     -pipeline off starts them after it) and, in host memory, averaged as
//     soon as its all-reduce completes (DDP's order; on a GPU the averaging
//     is a kernel issued after the backward pass). Each element is summed in
//     the order one all-reduce of the whole gradient sums it
//     (comm.Communicator.IAllReduceView), so the result's bits do not depend
//     on the buckets or on the overlap. No deviation.
//   - "dgc" (dgc.go): reference notes 7.4: Deep Gradient Compression:
//     per-tensor double sampling of the tensors of more than one dimension
//     (1-D tensors all-reduced dense), momentum correction with
//     momentum-factor masking (Options.Momentum, the optimizer's, which then
//     applies momentum to weight decay only), the density warm-up over the
//     first epochs (Reducer.SetStepsPerEpoch), local clipping scaled by 1/√n
//     (Method.ScaledClip, the trainer's), sparse all-gather. Deviations: the
//     samples' random start is seeded per rank, iteration and tensor; the
//     warm-up is the paper's 0.25^(e+1) (the reference's configuration ramps
//     with ρ^(1/(E+1))).
//   - "dragonn" (dragonn.go): reference notes 6: DRAGONN's sampled threshold
//     with the threshold test and the hashed insertion fused into one pass
//     (its kernel dragonnHash; no compaction of the candidates), small
//     tensors dense, dense warm-up (its own: during it every tensor is one of
//     the dense ones). Deviations (fixes): values are summed and divided by
//     the number of workers (the reference overwrites and does not divide);
//     error feedback is always on; element 0 can be selected; exact zeros
//     never are (a zero sampled threshold flooded the slots with zeros); hash
//     collisions resolve deterministically (highest index wins); ns and nsel
//     are at least 1. The momentum-corrected error feedback the paper
//     evaluated every method with (DGC's, with momentum-factor masking;
//     Options.Momentum, the optimizer's, which then applies momentum to
//     weight decay only). Not implemented: the paper's cost model (its eq. 1)
//     for which tensors to compress (a fixed min_tensor cut-off, the
//     reference's).
//   - "efsignsgd" (efsignsgd.go): reference notes 11.1: EF-SignSGD
//     (Karimireddy et al., 2019): each tensor of more than one dimension sent
//     as its signs, packed 32 to a 4-byte word, and its scale ‖acc‖₁/d (one
//     word), all-gathered; out = the mean of the workers' scaled signs; the
//     residual is what the worker's own scaled signs left out (error
//     feedback); 1-D tensors all-reduced dense. Deviations: ‖acc‖₁ is summed
//     in float64 (blocks of 4096 elements in order, the blocks' sums in
//     order, so a GPU gives the same bits) and rounded once; a zero counts as
//     positive (one bit per element has no 0). On a GPU the passes are its
//     kernel and the words stay in its memory.
//   - "fp16" (fp16.go): reference notes 11.4: FP16 compression as PyTorch
//     DDP's fp16_compress_hook (and Horovod's Compression.fp16): acc cast to
//     half precision and divided by the workers in half precision,
//     all-reduced in half precision (2 bytes per element, every addition
//     rounded to half in the canonical order), cast back; residual 0 (no
//     error feedback, as both). On a GPU the casts are its kernel (the same
//     bits) and the sum NCCL's half sum (its own order) or, staged, the
//     canonical order's (the same bits).
//   - "gtopk" (gtopk.go): reference notes 7.7: Shi et al.'s gTop-k tree
//     merge, power-of-two worker counts. Deviations: indices and values as
//     two messages (int32, float32) instead of indices packed as float32
//     (exact only below 2^24); merged candidates have distinct indices.
//   - "lags" (lags.go): reference notes 5: per merge group top-k and
//     all-gathers, the groups reduced during the backward pass (pipelined),
//     optional adaptive density (eq. 19 with c_u an upper bound on the
//     compression, as the paper's text says: densities in [1/c_u, 1]; the
//     formula as printed makes it a lower bound). Deviations: a group's
//     elements are taken in layout order (the reference concatenates them in
//     backward order: only tie order differs); when no ratio hides the
//     communication, 1/c_u is used; adjacent groups ready together (every
//     group with -overlap off) share one pair of all-gathers (the same
//     elements and bytes in fewer messages).
//   - "micro" (micro.go): reference notes 3: MiCRO's rotating disjoint
//     partitions with a shared threshold controller. Deviations: with one
//     worker the global count is recorded as with many (the reference's
//     threshold decays every call); empty partitions (N < n) are guarded.
//   - "mstopk" (mstopk.go): reference notes 11.3: MSTopk (Shi et al., 2021),
//     DRAGONN's approximate Top-k baseline: the threshold found by 30 rounds
//     of binary search between the mean and the maximum magnitude, counting
//     the elements above each candidate (no sort); the k1 <= k elements above
//     the best threshold not exceeding k, the rest drawn at random from those
//     between it and the lowest threshold above k; then exchanged as topk
//     (index lists all-gathered, the union all-reduced). Deviations: the
//     random draw is seeded by the run's seed, the rank and the call's search
//     (the reference draws with torch.randperm); when no candidate threshold
//     leaves at most k elements, all k are drawn from those above the lowest
//     one tried; the mean summed in float64 by blocks of 4096 elements. On a
//     GPU the whole selection runs there, the same bits (block statistics,
//     one count per round with the round's decision made on the device, the
//     candidates selected and the draw made by one device thread with the
//     CPU's generator): only the selection's count and thres1 come back.
//   - "oktopk" (oktopk.go): reference notes 7.8: Ok-Topk: local threshold
//     exact every 32 sparse calls and otherwise reused and raised, regions
//     re-balanced every 64, owners sum, global threshold exact every 32 and
//     otherwise adapted, residual zeroed only where sent and globally
//     selected; dense warm-up (option dense_warmup, default 512). Deviations
//     (fixes): the schedule counts from the end of the warm-up (the same for
//     the reference's 512); boundary proposals summed as int64 (the
//     reference's int32 overflows once P·N > 2^31); a worker with nothing
//     selected proposes the equal split and an empty global candidate set
//     keeps the global threshold (the reference crashes on both); indices
//     travel as int32, not as float32; layout order as for topkdsa.
//   - "powersgd" (powersgd.go): reference notes 11.2: PowerSGD (Vogels,
//     Karimireddy and Jaggi, 2019; epfml/powersgd and PyTorch's
//     powerSGD_hook): each tensor of more than one dimension as the matrix
//     (shape[0], rest), one power-iteration step of rank r warm-started from
//     the previous Q (the same seeded Gaussian start on every worker): P = MQ
//     all-reduced, orthogonalized by Gram–Schmidt, Q = MᵀP all-reduced and
//     averaged, out = PQᵀ, residual = acc − PQᵀ; 1-D tensors, and matrices
//     the hook leaves uncompressed ((rows+cols)·r·2 >= rows·cols),
//     all-reduced dense with the P's. Deviations: no dense warm-up (the
//     hook's start_powerSGD_iter; epfml's code has none); a tensor of unknown
//     shape is taken as the most nearly square matrix of its size; products
//     accumulated in float64 (in index order, rounded once: on a GPU its
//     kernel gives the same bits, where cuBLAS's float32 sums would not).
//   - "randomk" (randomk.go): k random indices shared by all ranks (seeded),
//     no indices on the wire. Baseline without a reference.
//   - "spardl" (spardl.go): reference notes 4: sparse reduce-scatter within
//     teams, B-SAG or R-SAG across teams, Bruck all-gather, global residual
//     collection. Deviations: the flat vector is blocked in layout order (the
//     reference reverses the parameters); R-SAG keeps 1/2^(s+1) of a value
//     dropped in round s (the paper's half in round 0), which conserves the
//     gradient.
//   - "threshold" (threshold.go): reference notes 7.5: |acc| >= λ (default
//     1/(2√k)), union all-reduced. Deviation: λ is rounded to float32 once
//     and reported as such.
//   - "topk" (topk.go): reference notes 7.1: each worker's exact top-k, index
//     lists all-gathered, the union all-reduced. No other deviation.
//   - "topka" (topk.go): reference notes 7.2, 7.8: TopkA of Ok-Topk, the
//     DEFT/MiCRO code's CLI "gtopk": all-gather of k (value, index) pairs per
//     worker. Deviations: indices as int32 (the DEFT/MiCRO copy sends int64);
//     Ok-Topk's dense warm-up is left to the trainer.
//   - "topkdsa" (topkdsa.go): reference notes 7.8: TopkDSA of the Ok-Topk
//     code (SparDL's TopDSA baseline): top-k sent to the owners of P
//     contiguous regions, owners sum, sparse or dense all-gather of the sums;
//     dense warm-up (option dense_warmup, default 512). Deviations (fixes):
//     the k selected elements are the ones sent (the reference sends only
//     |acc| strictly above the k-th largest yet zeroes all k in the residual,
//     so with k = 1 it sends nothing); the last region takes N − (P−1)⌊N/P⌋
//     elements (the reference's remainder is wrong for N mod P >= ⌊N/P⌋ and
//     divides by zero for N < P); indices travel as int32, not as float32
//     (exact only below 2^24); regions cut the layout order, not the reversed
//     parameter order.
//
// Every method except gtopk and dgc with momentum correction conserves the
// gradient: Σ_w residual_w + n·out =
// Σ_w acc_w up to float32 rounding.
//
// # What a method declares
//
// Each method's file registers one Method, beside its core, with
// everything other packages need to know about it; its name appears
// there only:
//
//   - New, its core's constructor, and Doc, what it is and how it deviates
//     from its reference (the list above).
//   - Params: its options (see "Method options" below); DenseWarmup, the
//     frame's dense warm-up; CheckWorkers and Check, the worker counts and
//     runs it refuses.
//   - Density: its paper's density per kind of model (the trainer's
//     default -density); Notes: what a run's record must say about it
//     (the trainer records them in run.json).
//   - The state a checkpoint keeps: its core implements Stateful, beside it.
//   - CorrectsMomentum and ScaledClip: what the trainer does differently
//     around it (DGC).
//   - Projectable or NotProjectable: whether its measured traffic carries
//     over to other worker counts (the reports' projection chart, or the
//     reason they give for leaving it out).
//   - Pipelined: its core reduces groups (Grouped) that can start during
//     the backward pass: the trainer pipelines it by default, the reports
//     list the pipeline option, the advisor hides its selection and
//     communication behind the backward pass. A core that profiles the
//     backward pass (Profiled; LAGS' adaptive density) gets its times from
//     the trainer.
//   - Kernels: its own GPU operations (device.Kernel), beside it.
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
// Pipelined against the core; the advisor's TestPlanMatchesReducers checks
// each Plan against the real reducer's communicator calls. A test in
// cmd/train declares a method with state, an option, advice and a default
// density in one file and shows it trained, checkpointed, resumed, in
// -help, run.json, the report and the advisor; tests in advise and reports
// show them handling a new method without a change.
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
//   - cltk: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - deft: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - dense: bucket_mb (-bucket-mb), float, >= 0 (0: one bucket, the whole
//     gradient), default 25: cap of a bucket in MiB (DDP's bucket_cap_mb; the
//     first bucket is capped at 1 MiB, as DDP's).
//   - dgc: sparsity_warmup (-sparsity-warmup), int, in [0, 1000] (0: none),
//     default 4: epochs of DGC's density warm-up, at most 1000: density
//     max(0.25^(e+1), ρ) in epoch e.
//   - dgc: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - dragonn: min_tensor (-min-tensor), int, in [0, 2147483647] (0: every
//     tensor), default 204800: compress only tensors with more elements.
//   - dragonn: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 200: dense all-reduce iterations before sparsifying.
//   - dragonn: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - efsignsgd: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - fp16: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - gtopk: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - lags: merge_size (-merge-size), int, in [1, 2147483647], default 8192:
//     merge threshold in elements (1: one group per tensor).
//   - lags: max_ratio (-max-ratio), float, 0 (off) or >= 1, default 0: upper
//     bound c_u >= 1 on the compression ratio of the adaptive per-group
//     density (densities in [1/c_u, 1]).
//   - lags: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - micro: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - mstopk: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - oktopk: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 512: dense all-reduce iterations before sparsifying.
//   - oktopk: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - powersgd: rank (-rank), int, in [1, 65536], default 1: PowerSGD's
//     approximation rank r (PyTorch's powerSGD_hook's default, 1).
//   - powersgd: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - randomk: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - spardl: teams (-teams), int, in [1, 2147483647], default 1: number of
//     teams G (must divide the number of workers).
//   - spardl: sag (-sag), string, bruck or rsag, default bruck:
//     spar-all-gather across teams: bruck (B-SAG) or rsag (recursive
//     doubling, R-SAG; a power-of-two number of teams).
//   - spardl: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - threshold: lambda (-lambda), float, in [0, 3.4028234663852886e+38] (0:
//     1/(2√k), recomputed every call), default 0: hard threshold λ: every
//     element with |acc| >= λ is sent.
//   - threshold: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
//   - topk: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - topka: min_compress_size (-min-compress-size), int, in [0, 2147483647],
//     default 0: tensors of fewer elements are all-reduced dense by the
//     frame, outside the method, and counted as such (0: none, the method's
//     paper's behaviour).
//   - topkdsa: dense_warmup (-dense-warmup), int, in [0, 2147483647] (0:
//     none), default 512: dense all-reduce iterations before sparsifying.
//   - topkdsa: min_compress_size (-min-compress-size), int, in [0,
//     2147483647], default 0: tensors of fewer elements are all-reduced dense
//     by the frame, outside the method, and counted as such (0: none, the
//     method's paper's behaviour).
package sparsify

//go:generate go test -run ^TestOptionsDoc$ -update-options-doc .
//go:generate go test -run ^TestMethodsDoc$ -update-methods-doc .
