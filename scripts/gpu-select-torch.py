#!/usr/bin/env python3
"""PyTorch's side of docs/bench/gpu-select.md: torch.topk by magnitude and
a threshold selection (torch.nonzero of |x| >= t plus the gathered values)
on a ResNet-18-sized float32 gradient (11,173,962 normal values), the same
cases as the Go benchmark BenchmarkGPUSelect (cuda/bench_test.go), timed
the same way: each call synchronised, the calls rotating over four
gradients (179 MB, more than the L2 cache). Prints one JSON line per case:
the median time over --reps calls after warm-up.

    python3 scripts/gpu-select-torch.py [--reps 200]
"""
import argparse
import json
import time

import torch

N = 11173962


SETS = 4


def timed(f, reps):
    for i in range(2 * SETS):
        f(i % SETS)
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        t0 = time.perf_counter()
        f(i % SETS)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(2)
    xs = [torch.randn(N, device="cuda", generator=g) for _ in range(SETS)]
    y = torch.empty_like(xs[0])
    dev = torch.cuda.get_device_name()
    t = timed(lambda s: y.copy_(xs[s]), a.reps)
    print(json.dumps({"case": "copy-d2d", "us": t * 1e6, "GBps": 8 * N / t / 1e9, "device": dev, "torch": torch.__version__}))
    for rho in (0.01, 0.001):
        k = int(rho * N)

        def topk(s):
            v, i = torch.topk(xs[s].abs(), k, sorted=False)
            return xs[s][i]

        t = timed(topk, a.reps)
        print(json.dumps({"case": f"topk-{rho:g}", "us": t * 1e6}))
        thr = [torch.topk(x.abs(), k).values[-1] for x in xs]

        def above(s):
            i = torch.nonzero(xs[s].abs() >= thr[s]).squeeze(1)
            return i, xs[s][i]

        t = timed(above, a.reps)
        print(json.dumps({"case": f"select-above-{rho:g}", "us": t * 1e6}))


if __name__ == "__main__":
    main()
