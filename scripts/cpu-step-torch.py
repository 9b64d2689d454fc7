#!/usr/bin/env python3
"""PyTorch's side of scripts/bench-cpu-step: one training step of a case on
the CPU, the same models, batches and optimizers as the Go benchmark
BenchmarkCPUStep (models/cpustep_bench_test.go) on random data.

    python3 scripts/cpu-step-torch.py CASE THREADS STEPS

CASE is resnet18-b32, resnet18-b128, lstm-default-b32, lstm-small-b32 or
ncf-default-ml20m-b256; THREADS PyTorch's intra-op threads; STEPS the timed
steps after one warm-up step. Prints one JSON line (STEP {...}): the median
step and the process's CPU seconds per step. Needs PyTorch (Debian:
apt-get install python3-torch; Debian's build does its CPU convolutions with
Debian's oneDNN, libdnnl2).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "resnet18-b32": ("resnet18", 32, "default"),
    "resnet18-b128": ("resnet18", 128, "default"),
    "lstm-default-b32": ("lstm", 32, "default"),
    "lstm-small-b32": ("lstm", 32, "small"),
    "ncf-default-ml20m-b256": ("ncf", 256, "default"),
}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} CASE THREADS STEPS; CASE one of {', '.join(CASES)}")
    name, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch
    from torch_models import make_step
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    kind, batch, preset = CASES[name]
    step = make_step(kind, batch, preset=preset)
    step()  # warm-up
    times = []
    c0 = time.process_time()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / steps
    med = sorted(times)[len(times) // 2]
    print("STEP " + json.dumps({"impl": "torch", "case": name, "threads": torch.get_num_threads(), "steps": steps,
                                "median_ms": 1e3 * med, "cpu_s_per_step": cpu, "times_s": times,
                                "torch": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available()}), flush=True)


if __name__ == "__main__":
    main()
