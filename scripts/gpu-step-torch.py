#!/usr/bin/env python3
"""PyTorch's training-step time on a GPU, eager mode, for docs/bench/gpu.md.

The same models, batches and optimizers as the Go benchmark
BenchmarkGPUStep (cuda/bench_test.go): ResNet-18 batch 128 (CIFAR shapes),
the LSTM default preset batch 32 (BPTT 30), NCF default preset at batch 256
and 65,536. float32 with TF32 off (torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32 False) unless --tf32; cuDNN benchmark mode
on. Prints one JSON line per case: the median step time over --steps steps
after --warmup steps, each step synchronised.

    python3 scripts/gpu-step-torch.py [--tf32] [--steps 50]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import make_step  # noqa: E402

CASES = [
    ("resnet18-b128", "resnet18", 128, "default"),
    ("lstm-default-b32", "lstm", 32, "default"),
    ("ncf-default-b256", "ncf", 256, "default"),
    ("ncf-default-b65536", "ncf", 65536, "default"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(1)
    for name, kind, batch, preset in CASES:
        step = make_step(kind, batch, "cuda", preset)
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        times.sort()
        print(json.dumps({"model": name, "ms_per_step": round(1e3 * times[len(times) // 2], 3),
                          "tf32": a.tf32, "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0)}), flush=True)
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
