#!/usr/bin/env python3
"""Peak resident memory and step time of one training worker in PyTorch.

The PyTorch side of docs/bench/memory.md: the same models, batch sizes,
optimizers and thread count as models/memory_test.go (TestPeakMemory), on
random data, 5 training steps (the median step time after the first is
reported), each case in a fresh process.

    python3 scripts/memory-torch.py            # every case
    python3 scripts/memory-torch.py resnet18-b32

Needs PyTorch (Debian: apt-get install python3-torch). Threads: torch uses
as many intra-op threads as the Go side's OpenBLAS (the number of cores).
"""
import json
import os
import resource
import subprocess
import sys
import time

CASES = [
    "resnet18-b32",
    "lstm-default-b32",
    "lstm-small-b32",
    "ncf-default-ml20m-b256",
    "ncf-paper-ml1m-b256",
]
def build(name):
    """The training step of a case (torch_models.make_step on the CPU)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_models import make_step
    return {
        "resnet18-b32": lambda: make_step("resnet18", 32),
        "lstm-default-b32": lambda: make_step("lstm", 32, preset="default"),
        "lstm-small-b32": lambda: make_step("lstm", 32, preset="small"),
        "ncf-default-ml20m-b256": lambda: make_step("ncf", 256, preset="default"),
        "ncf-paper-ml1m-b256": lambda: make_step("ncf", 256, preset="paper"),
    }[name]()


def child(name):
    import torch
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(1)
    train_step = build(name)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - t0)
    last = sorted(times[1:])[len(times[1:]) // 2]  # the median after the first (warm-up)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"model": name, "peak_rss_mb": round(peak_mb, 1), "step_s": round(last, 4),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    names = sys.argv[1:] or CASES
    for n in names:
        if n not in CASES:
            sys.exit(f"unknown case {n}; use one of {', '.join(CASES)}")
        subprocess.run([sys.executable, __file__, "--child", n], check=True)


if __name__ == "__main__":
    main()
