package main

import (
	"encoding/json"
	"flag"
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/sweep"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestModelSizeFlag: the model size is -model-size in train, train sweep
// and train advise; train and train advise still take its older name
// -preset (train sweep's -preset names a sweep), and a resume counts
// either as the option given.
func TestModelSizeFlag(t *testing.T) {
	for _, args := range [][]string{{"-model", "lstm", "-model-size", "default"}, {"-model", "lstm", "-preset", "default"}} {
		fs, v, _ := newFlags(io.Discard)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if v.Preset != "default" || !givenFlags(fs)["model-size"] {
			t.Errorf("%v: preset %q, given %v", args, v.Preset, givenFlags(fs))
		}
	}
	afs, a := newAdviseFlags(io.Discard)
	if err := afs.Parse([]string{"-preset", "paper"}); err != nil || a.base.Preset != "paper" {
		t.Errorf("advise -preset paper: %v, preset %q", err, a.base.Preset)
	}
	sfs, s := newSweepFlags(io.Discard)
	if err := sfs.Parse([]string{"-preset", "deft-buildup", "-model-size", "paper"}); err != nil || s.preset != "deft-buildup" || s.base.Preset != "paper" {
		t.Errorf("sweep -preset deft-buildup -model-size paper: %v, sweep %q, size %q", err, s.preset, s.base.Preset)
	}
}

// TestTrainArgsGiveTheConfig: the command line the sweep prints for a
// point (trainArgs), read back by train's flags, is the point's
// configuration (but -workers and the emulated network, which an mpirun
// job replaces), for a configuration that sets every kind of option.
func TestTrainArgsGiveTheConfig(t *testing.T) {
	want := train.Config{
		Model: "lstm", Dataset: "wikitext2", DataDir: "/data", Download: true, Preset: "default", Sparsifier: "lags",
		Density: train.Set(0.004), MethodOptions: sparsify.Values{"merge_size": 3, "max_ratio": 100.0}, Pipeline: "off", ClipAt: "local",
		Epochs: train.Set(3), Steps: 40, MaxTime: 90 * time.Second, Batch: train.Set(8), EvalBatch: train.Set(5), LR: train.Set(2.5),
		Seed: train.Set[uint64](0), Optimizer: "sgd", Momentum: train.Set(0.5), Nesterov: true, WeightDecay: train.Set(1e-5),
		WarmupEpochs: 0.5, DecayEpochs: []int{}, DecayFactor: train.Set(0.5), Clip: train.Set(0.25), LabelSmoothing: 0.1,
		Device: "cpu", Comm: "local", LogEvery: train.Set(2), EvalEvery: 7, MaxEvalBatches: 3, BLAS: "gonum", BLASThreads: 1,
		Kernels: "im2col", Executors: 1, CheckpointEvery: 11, CheckEvery: 13, RecordGradients: "/rec", NoAugment: true,
	}
	p := sweep.Point{Config: want}
	p.Config.Workers, p.Config.NetLatency, p.Config.NetBandwidth = train.Set(4), time.Millisecond, 1e9
	args := trainArgs(p, filepath.Join("sweep", "runs", "x"))
	fs, v, _ := newFlags(io.Discard)
	if err := fs.Parse(args[2:]); err != nil || args[0] != "-model" {
		t.Fatalf("%v: %v", args, err)
	}
	v.Model = args[1]
	want.Out = filepath.Join("sweep", "runs", "x")
	got, wantD := v.Defaults(), want.Defaults()
	if !reflect.DeepEqual(got, wantD) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(wantD)
		t.Errorf("train %v\ngives %s\n want %s", args, g, w)
	}
	var set []string
	fs.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
	for _, f := range []string{"workers", "net-latency", "net-bandwidth", "device", "model"} {
		if slices.Contains(set, f) {
			t.Errorf("trainArgs gives -%s: %v", f, args)
		}
	}
}
