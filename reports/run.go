package reports

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/sparsegrad/sparsegrad/metrics"
)

// Run is the content of one run directory.
type Run struct {
	// Dir is the directory the run was read from.
	Dir string
	// Info is the part of run.json the reports use.
	Info RunInfo
	// Config is run.json's "config" object as decoded JSON, for the header
	// table and for telling compared runs apart.
	Config map[string]any
	// Steps are the "step" records in file order.
	Steps []Step
	// Evals are the "eval" records in file order.
	Evals []Eval
}

// RunInfo is run.json (metrics.Run), with the part of its configuration
// the reports use; the GPU's report is not read.
type RunInfo = metrics.Run[RunConfig, json.RawMessage]

// RunConfig is the part of run.json's "config" the reports use.
type RunConfig struct {
	Model      string  `json:"model"`
	Dataset    string  `json:"dataset"`
	Sparsifier string  `json:"sparsifier"`
	Density    float64 `json:"density"`
	Workers    int     `json:"workers"`
	Seed       uint64  `json:"seed"`
	Device     string  `json:"device"`
	Epochs     int     `json:"epochs"`
}

// Step is one "step" record of metrics.jsonl (metrics.Step, which defines
// the fields), with numbers as float64. Numbers that are absent or null are
// NaN.
type Step struct {
	Epoch, Step                                 int
	Loss, LR, Density, ActualDensity, ErrorNorm float64
	// Threshold is NaN for methods without one.
	Threshold                                    float64
	BytesSent, BytesRecv                         float64
	TForward, TBackward, TSelect, TComm, TUpdate float64
	TIter, TWait, TCompute                       float64
	// TCommWall is the wall time of the reduction (metrics.Step.TCommWall).
	TCommWall float64
	// TQueue is the wait for a shared executor (metrics.Step.TQueue).
	TQueue           float64
	Samples, Workers int
	Wall             float64
	// LayerK is the selected elements per tensor (DEFT), nil if absent.
	LayerK []int
	// Ops are rank 0's per-operation counters of this step, nil if absent.
	Ops map[string]OpCount
}

// OpCount is the "ops" entry of one communicator operation in a step record.
type OpCount = metrics.OpCount

// Eval is one "eval" record of metrics.jsonl (metrics.Eval).
type Eval struct {
	Epoch, Step int
	Wall        float64
	Metric      string
	Value       float64
	// Split is the split evaluated ("test", "validation"; "" when not
	// recorded).
	Split string
	// Evaluated and SplitSize count what the evaluation covered and what
	// the split holds, in Unit (0 when not recorded).
	Evaluated, SplitSize int
	Unit                 string
}

// partial reports whether e evaluated a sample of its split.
func (e *Eval) partial() bool { return e.SplitSize > 0 && e.Evaluated < e.SplitSize }

// record is what one line of metrics.jsonl decodes into: the step schema of
// package metrics plus the fields only eval records have (the shared ones,
// type, epoch, step and wall, are the step's). Decoding starts from
// nanRecord, so that numbers a line does not give are NaN.
type record struct {
	metrics.Step
	Metric    string      `json:"metric"`
	Value     metrics.Num `json:"value"`
	Split     string      `json:"split"`
	Evaluated int         `json:"evaluated"`
	SplitSize int         `json:"split_size"`
	Unit      string      `json:"unit"`
}

// nanRecord is a record whose every number is NaN.
var nanRecord = func() record {
	r := record{}
	setNaN(reflect.ValueOf(&r).Elem())
	return r
}()

// setNaN sets every metrics.Num field of the struct v, and of the structs
// it embeds, to NaN.
func setNaN(v reflect.Value) {
	num := reflect.TypeOf(metrics.Num(0))
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == num:
			f.SetFloat(math.NaN())
		case v.Type().Field(i).Anonymous && f.Kind() == reflect.Struct:
			setNaN(f)
		}
	}
}

// val is the value of a Num that may be absent.
func val(p *metrics.Num) float64 {
	if p == nil {
		return math.NaN()
	}
	return float64(*p)
}

// ReadRun reads run.json and metrics.jsonl of runDir. A metrics file that
// does not exist yet (a run that has not logged a step) gives a run without
// records; a last line without its newline that does not parse (a file being
// written) is ignored.
func ReadRun(runDir string) (*Run, error) {
	r := &Run{Dir: runDir}
	b, err := os.ReadFile(filepath.Join(runDir, "run.json"))
	if err != nil {
		return nil, fmt.Errorf("reports: reading the run directory %s (a directory written by train -out, with run.json and metrics.jsonl): %w", runDir, err)
	}
	if err := json.Unmarshal(b, &r.Info); err != nil {
		return nil, fmt.Errorf("reports: %s: run.json is not valid: %w", runDir, err)
	}
	var raw struct {
		Config map[string]any `json:"config"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("reports: %s: run.json is not valid: %w", runDir, err)
	}
	r.Config = raw.Config
	if r.Config == nil {
		return nil, fmt.Errorf("reports: %s: run.json has no \"config\" object; is it a run.json written by train?", runDir)
	}
	if r.Info.Workers == 0 {
		r.Info.Workers = r.Info.Config.Workers
	}
	r.Steps, r.Evals, err = readMetrics(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("reports: %s: metrics.jsonl: %w", runDir, err)
	}
	return r, nil
}

// metricsCache keeps the records already parsed of the metrics files read
// last, so that a report refreshed every epoch parses only the new lines.
var metricsCache struct {
	sync.Mutex
	files map[string]*cachedMetrics
	order []string
}

// metricsCacheFiles is the number of files metricsCache remembers.
const metricsCacheFiles = 4

type cachedMetrics struct {
	p    metricsParser
	size int64  // bytes of complete lines parsed
	head []byte // the file's first bytes, to notice a rewritten file
}

const headBytes = 4096

// forget drops key from metricsCache (locked by the caller).
func forget(key string) {
	delete(metricsCache.files, key)
	metricsCache.order = slices.DeleteFunc(metricsCache.order, func(k string) bool { return k == key })
}

// readMetrics returns the records of the metrics file at path (none if it
// does not exist), parsing only what was appended since the last call when
// the file only grew.
func readMetrics(path string) ([]Step, []Eval, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	head := make([]byte, headBytes)
	nh, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	head = head[:nh]
	key, err := filepath.Abs(path)
	if err != nil {
		key = path
	}

	metricsCache.Lock()
	defer metricsCache.Unlock()
	c := metricsCache.files[key]
	// The cache holds if what it read is still the file's beginning: its
	// head is a prefix of the current one and the file is not shorter.
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if c == nil || len(c.head) > nh || !bytes.Equal(c.head, head[:len(c.head)]) || st.Size() < c.size {
		c = &cachedMetrics{}
	}
	if _, err := f.Seek(c.size, io.SeekStart); err != nil {
		return nil, nil, err
	}
	n, tail, err := c.p.parse(f)
	if err != nil {
		forget(key)
		return nil, nil, err
	}
	c.size += n
	c.head = head
	if metricsCache.files == nil {
		metricsCache.files = map[string]*cachedMetrics{}
	}
	forget(key)
	metricsCache.files[key] = c
	metricsCache.order = append(metricsCache.order, key)
	if len(metricsCache.order) > metricsCacheFiles {
		forget(metricsCache.order[0])
	}
	// Copies: the cache appends to its own slices later.
	steps := append([]Step(nil), c.p.steps...)
	evals := append([]Eval(nil), c.p.evals...)
	if tail != nil {
		steps = append(steps, tail.steps...)
		evals = append(evals, tail.evals...)
	}
	return steps, evals, nil
}

// metricsParser accumulates the records of a metrics file that may be read
// in several pieces, each starting where the previous complete line ended.
type metricsParser struct {
	steps []Step
	evals []Eval
	lines int // complete lines parsed so far
}

// parse reads records from rd until its end and returns the number of bytes
// of complete (newline-terminated) lines consumed; a valid last record
// without its newline is returned in tail, not added to p.
func (p *metricsParser) parse(rd io.Reader) (consumed int64, tail *metricsParser, err error) {
	br := bufio.NewReaderSize(rd, 1<<16)
	for {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line (e.g. layer_k of a large model): collect it whole.
			long := append([]byte(nil), b...)
			for errors.Is(err, bufio.ErrBufferFull) {
				b, err = br.ReadSlice('\n')
				long = append(long, b...)
			}
			b = long
		}
		last := err != nil
		line := p.lines + 1
		if err != nil && !errors.Is(err, io.EOF) {
			return consumed, nil, fmt.Errorf("line %d: %w", line, err)
		}
		n := int64(len(b))
		b = bytes.TrimSpace(b)
		if len(b) > 0 {
			rec := nanRecord
			if perr := json.Unmarshal(b, &rec); perr != nil {
				if last {
					return consumed, nil, nil // an unterminated last line: still being written
				}
				return consumed, nil, fmt.Errorf("line %d is not a metrics record (a JSON object per line): %w", line, perr)
			}
			if last {
				// A complete record without its newline: returned apart, so
				// that it is read again with the next piece of the file.
				tail = &metricsParser{}
				if err := tail.add(rec, line); err != nil {
					return consumed, nil, err
				}
				return consumed, tail, nil
			}
			if err := p.add(rec, line); err != nil {
				return consumed, nil, err
			}
		}
		if last {
			return consumed, nil, nil
		}
		consumed += n
		p.lines++
	}
}

func (p *metricsParser) add(rec record, line int) error {
	switch rec.Type {
	case metrics.TypeStep:
		p.steps = append(p.steps, Step{Epoch: rec.Epoch, Step: rec.Step.Step, Loss: float64(rec.Loss), LR: float64(rec.LR),
			Density: float64(rec.Density), ActualDensity: float64(rec.ActualDensity), ErrorNorm: float64(rec.ErrorNorm),
			Threshold: val(rec.Threshold), BytesSent: float64(rec.BytesSent), BytesRecv: float64(rec.BytesRecv),
			TForward: float64(rec.TForward), TBackward: float64(rec.TBackward), TSelect: float64(rec.TSelect),
			TComm: float64(rec.TComm), TUpdate: float64(rec.TUpdate), TIter: float64(rec.TIter), TWait: float64(rec.TWait),
			TCompute: float64(rec.TCompute), TCommWall: float64(rec.TCommWall), TQueue: float64(rec.TQueue), Samples: rec.Samples, Workers: rec.Workers,
			Wall: float64(rec.Wall), LayerK: rec.LayerK, Ops: rec.Ops})
	case metrics.TypeEval:
		if rec.Metric == "" {
			return fmt.Errorf("line %d: eval record without \"metric\"", line)
		}
		p.evals = append(p.evals, Eval{Epoch: rec.Epoch, Step: rec.Step.Step, Wall: float64(rec.Wall), Metric: rec.Metric, Value: float64(rec.Value),
			Split: rec.Split, Evaluated: rec.Evaluated, SplitSize: rec.SplitSize, Unit: rec.Unit})
	}
	return nil
}

// metricInfo describes how an evaluation metric is shown.
type metricInfo struct {
	label  string  // without the split: onSplit adds it
	unit   string  // axis unit, "" for none
	scale  float64 // shown value = scale × recorded value
	higher bool    // larger is better
	group  string  // metrics of one group share a chart
}

func metricOf(name string) metricInfo {
	switch name {
	case "accuracy":
		return metricInfo{"accuracy", "%", 100, true, "fraction"}
	case "hr10":
		return metricInfo{"HR@10", "%", 100, true, "fraction"}
	case "ndcg10":
		return metricInfo{"NDCG@10", "%", 100, true, "fraction"}
	case "perplexity":
		return metricInfo{"perplexity", "", 1, false, "perplexity"}
	case "loss":
		return metricInfo{"loss", "", 1, false, "loss"}
	}
	low := strings.ToLower(name)
	lower := strings.Contains(low, "loss") || strings.Contains(low, "perplexity") || strings.Contains(low, "error")
	return metricInfo{name, "", 1, !lower, "other:" + name}
}

// split returns the split r's evaluations ran on: as recorded, else (runs
// recorded before the split was) the one train evaluates for the run's data
// set: WikiText-2's validation split, the test split otherwise.
func (r *Run) split() string {
	for _, e := range r.Evals {
		if e.Split != "" {
			return e.Split
		}
	}
	if r.Info.Config.Dataset == "wikitext2" {
		return "validation"
	}
	return "test"
}

// splitOf is the split of runs' evaluations, "evaluation" when they differ.
func splitOf(runs []*Run) string {
	s := ""
	for _, r := range runs {
		if len(r.Evals) == 0 {
			continue
		}
		switch rs := r.split(); {
		case s == "":
			s = rs
		case s != rs:
			return "evaluation"
		}
	}
	if s == "" {
		return "test"
	}
	return s
}

// onSplit names a metric with its split, e.g. "validation perplexity".
func onSplit(split, metric string) string {
	return split + " " + metricOf(metric).label
}

// sample describes the sample a partial evaluation covered, e.g. "17,500
// of 217,646 tokens", and "" for an evaluation of the whole split (or one
// recorded without its counts).
func (e *Eval) sample() string {
	if !e.partial() {
		return ""
	}
	return metrics.Thousands(e.Evaluated) + " of " + metrics.Thousands(e.SplitSize) + " " + e.Unit
}

// partialEval returns r's last evaluation of a sample of its split (nil if
// every evaluation covered the whole split).
func (r *Run) partialEval() *Eval {
	for i := len(r.Evals) - 1; i >= 0; i-- {
		if r.Evals[i].partial() {
			return &r.Evals[i]
		}
	}
	return nil
}

// sampleNote is the page's note on r's partial evaluations ("" if none).
func (r *Run) sampleNote() string {
	e := r.partialEval()
	if e == nil {
		return ""
	}
	return "The " + r.split() + " metrics are measured on a sample of the " + r.split() + " split (" + e.sample() +
		"; -max-eval-batches, a run shorter than an epoch, or -max-time running out, evaluates a sample): they are estimates, noisier than an evaluation of the whole split."
}

// metricNames returns the names of r's eval metrics, the primary one (the
// one the header and the ranking use) first.
func (r *Run) metricNames() []string {
	seen := map[string]bool{}
	var names []string
	for _, e := range r.Evals {
		if !seen[e.Metric] {
			seen[e.Metric] = true
			names = append(names, e.Metric)
		}
	}
	// The LSTM's perplexity before its token accuracy; CIFAR's accuracy.
	pref := map[string]int{"perplexity": 0, "accuracy": 1, "hr10": 2, "ndcg10": 3, "loss": 5}
	rank := func(n string) int {
		if p, ok := pref[n]; ok {
			return p
		}
		return 4
	}
	sort.SliceStable(names, func(i, j int) bool { return rank(names[i]) < rank(names[j]) })
	return names
}

// primary returns the primary metric's name ("" without evaluations).
func (r *Run) primary() string {
	if n := r.metricNames(); len(n) > 0 {
		return n[0]
	}
	return ""
}

// final and best return the last and the best value of metric (NaN if none).
func (r *Run) finalBest(metric string) (final, best float64) {
	f, b := r.finalBestEval(metric)
	final, best = math.NaN(), math.NaN()
	if f != nil {
		final, best = f.Value, b.Value
	}
	return final, best
}

// finalBestEval returns the last and the best evaluation of metric (nil if
// none).
func (r *Run) finalBestEval(metric string) (final, best *Eval) {
	better := metricOf(metric).higher
	for i := range r.Evals {
		e := &r.Evals[i]
		if e.Metric != metric || math.IsNaN(e.Value) {
			continue
		}
		final = e
		if best == nil || (better && e.Value > best.Value) || (!better && e.Value < best.Value) {
			best = e
		}
	}
	return final, best
}

// duration is the largest wall time recorded (seconds; NaN if none).
func (r *Run) duration() float64 {
	d := math.NaN()
	for _, s := range r.Steps {
		if !math.IsNaN(s.Wall) && !(s.Wall <= d) {
			d = s.Wall
		}
	}
	for _, e := range r.Evals {
		if !math.IsNaN(e.Wall) && !(e.Wall <= d) {
			d = e.Wall
		}
	}
	return d
}

// totalBytesSent estimates the bytes one worker sent over the whole run:
// each record's bytes stand for the steps since the previous record (step
// records may be written every log_every steps only).
func (r *Run) totalBytesSent() float64 {
	total, prev := 0.0, 0
	any := false
	for _, s := range r.Steps {
		span := max(1, s.Step-prev)
		prev = s.Step
		if !math.IsNaN(s.BytesSent) {
			total += s.BytesSent * float64(span)
			any = true
		}
	}
	if !any {
		return math.NaN()
	}
	return total
}

// mean is the mean of the finite values of f over the steps (NaN if none).
func (r *Run) mean(f func(*Step) float64) float64 {
	sum, n := 0.0, 0
	for i := range r.Steps {
		if v := f(&r.Steps[i]); !math.IsNaN(v) && !math.IsInf(v, 0) {
			sum += v
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// median is the median of the finite values of f over the steps (NaN if
// none).
func (r *Run) median(f func(*Step) float64) float64 {
	vals := make([]float64, len(r.Steps))
	for i := range r.Steps {
		vals[i] = f(&r.Steps[i])
	}
	return quantile(vals, 0.5)
}

// hasThreshold reports whether any step recorded a threshold.
func (r *Run) hasThreshold() bool {
	return slices.ContainsFunc(r.Steps, func(s Step) bool { return !math.IsNaN(s.Threshold) })
}

// name is the run's short name: its directory's base name.
func (r *Run) name() string {
	return filepath.Base(filepath.Clean(r.Dir))
}

// device names where the run's model ran: run.json's device, else the
// configured one (runs recorded before the device was written).
func (r *Run) device() string {
	if r.Info.Device != "" {
		return r.Info.Device
	}
	return r.Info.Config.Device
}
