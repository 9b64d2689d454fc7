// Package reports owns the HTML reports of training runs: it reads a run
// directory (run.json and metrics.jsonl, as package train writes them) and
// turns it into one self-contained page of charts (WriteRun), or several run
// directories of one model into a comparison page (Compare). Charts are built
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
// metrics.jsonl, one JSON object per line; lines of other types are ignored:
//
//   - "type":"step": epoch, step, loss, density, actual_density, error_norm,
//     threshold (absent where the method has none), bytes_sent, bytes_recv,
//     t_forward, t_backward, t_select, t_comm, t_update, t_iter, t_compute
//     (seconds; null where not measured), samples, workers, wall (seconds
//     since the start), and optionally "layer_k" (selected elements per
//     tensor, layout order) and "ops": per communicator operation (names as
//     comm.Op.String: "allreduce", "allgather", "allgatherv", "broadcast",
//     "reducescatter", "send", "recv", "sendrecv", "barrier") the counters of
//     rank 0 during that step: {"calls", "elements", "bytes_sent",
//     "bytes_recv", "time" (seconds)}. The projected communication time chart
//     appears only when "ops" is present.
//   - "type":"eval": epoch, step, wall, metric ("accuracy", "perplexity",
//     "hr10", "ndcg10", "loss" or another name), value.
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
