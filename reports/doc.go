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
// Series longer than Options.MaxPoints (default 5,000) are downsampled keeping
// each bucket's minimum and maximum, so a long run's page stays small.
package reports
