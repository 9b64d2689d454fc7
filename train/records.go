package train

import (
	"github.com/sparsegrad/sparsegrad/metrics"
)

// The records of metrics.jsonl are declared once, in package metrics, which
// package reports reads with; these aliases keep their train names.
type (
	// Num is metrics.Num: a float64 written as null when NaN or infinite.
	Num = metrics.Num
	// StepRecord is metrics.Step, a line with "type":"step".
	StepRecord = metrics.Step
	// OpCount is metrics.OpCount, one operation's traffic in a step record.
	OpCount = metrics.OpCount
	// EvalRecord is metrics.Eval, a line with "type":"eval".
	EvalRecord = metrics.Eval
)
