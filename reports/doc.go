// Package reports owns the HTML reports of training runs: it reads a run
// directory (run.json and metrics.jsonl, as package train writes them) and
// turns it into one self-contained page of charts (WriteRunWith), or several run
// directories of one model into a comparison page (CompareWith). Charts are built
// with github.com/go-echarts/go-echarts/v2; the page itself is rendered here,
// with every string from a run escaped, and by default the ECharts script
// inlined so that the page needs no network (see ECharts).
//
// # What the charts read
//
// run.json: "config" (model, dataset, sparsifier, density, workers, seed,
// device and the method options), "workers", "backend", "machine", "start",
// "command_line"; optional "layer_names" (one name per tensor of the
// layout, for DEFT's per-layer k chart).
//
// metrics.jsonl, one JSON object per line, in the schema package metrics
// declares (the one definition train writes with: metrics.Step for
// "type":"step", metrics.Eval for "type":"eval"); lines of other types are
// ignored, absent or null numbers read as NaN. TestReadsEveryMetricsField
// checks that every field of that schema reaches Step and Eval. What the
// charts make of them:
//
//   - step records give the loss, setup and actual density, error and
//     threshold charts, the bytes chart, DEFT's per-layer k chart
//     ("layer_k", every tensor named), and the time breakdown of the worker
//     each record holds (the one the others waited for): its phases add up
//     to its iteration (Run.Breakdown) — the wait for a shared executor and
//     the other simulated workers' turns (t_queue), forward and backward (or
//     their sum t_compute), and for a sequential reduction selection
//     (t_select), communication (t_comm, at most what t_wait leaves),
//     error feedback and the reducer's other work (the rest of t_wait) and
//     update; each bar the median of the iterations it stands for, with the
//     10th and 90th percentiles of the iteration time; a few towering bars or
//     percentiles are cut off and named. A pipelined run (run.json's
//     "pipelined", or a step whose reduction outlasted the part after the
//     backward pass, t_comm_wall > t_wait) reduces during the backward pass
//     with overlapping calls, so its reduction is shown as the part of the
//     backward pass it ran alongside (t_comm_wall − t_wait, taken out of the
//     backward time) and the part after it (t_wait), never as t_comm, which
//     counts overlapping time several times; the header says the same, and a
//     chart shows t_comm_wall against t_wait and t_comm.
//   - "ops" (rank 0's per-operation communicator counters) gives the
//     projected communication time at other worker counts and bandwidths
//     (comm/netmodel.Project), drawn only for the methods whose per-worker
//     payload and number of calls do not depend on the worker count (dense,
//     topka, randomk, cltk, dgc, dragonn, lags); the page says why the others
//     are left out (SparDL's and gTop-k's log₂ n rounds, unions or
//     per-worker shares that change with n, one message per peer).
//   - eval records give the metric charts and the time-to-target table,
//     named by the split evaluated ("split"; for records without it,
//     WikiText-2's validation split, else the test split); an evaluation
//     of a sample of the split ("evaluated" < "split_size") is labelled as
//     one beside its value, on the charts and in a note.
//
// Legends never page: they wrap, and a chart grows to hold them; a
// comparison's time chart labels every run.
//
// # The ECharts script
//
// By default a page inlines dist/echarts.min.js of the npm package echarts,
// version EChartsVersion, checked against EChartsSHA256, so that it opens
// with no network. The script is never part of the repository: ECharts reads
// it from the file the environment variable SPARSEGRAD_ECHARTS names, else
// from the user's cache directory (os.UserCacheDir()/sparsegrad), else runs
// `npm pack echarts@5.6.0` once (tarball checked against the registry's
// integrity string) and caches it. Without npm: download
// https://registry.npmjs.org/echarts/-/echarts-5.6.0.tgz, extract
// package/dist/echarts.min.js and set SPARSEGRAD_ECHARTS to its path; or set
// Options.AssetsURL (train's -report-assets URL) to load the script from a
// CDN, e.g. https://cdn.jsdelivr.net/npm/echarts@5.6.0/dist/echarts.min.js —
// such a page needs that URL to be reachable.
//
// Series longer than Options.MaxPoints (default 5,000) are downsampled keeping
// each bucket's minimum and maximum, so a long run's page stays small.
package reports
