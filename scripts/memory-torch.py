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
WIKITEXT2_VOCAB = 33278


def build(name):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + self.shortcut(x))

    class ResNet18(nn.Module):  # the CIFAR variant of the DEFT code
        def __init__(self, classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            layers, cin = [], 64
            for s, cout in enumerate([64, 128, 256, 512]):
                for b in range(2):
                    layers.append(BasicBlock(cin, cout, 2 if s > 0 and b == 0 else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.linear = nn.Linear(512, classes)

        def forward(self, x):
            y = self.layers(F.relu(self.bn1(self.conv1(x))))
            return self.linear(F.adaptive_avg_pool2d(y, 1).flatten(1))

    class LSTMLM(nn.Module):
        def __init__(self, vocab, size, layers, dropout):
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(vocab, size)
            self.rnn = nn.LSTM(size, size, layers, dropout=dropout)
            self.decoder = nn.Linear(size, vocab)
            self.decoder.weight = self.encoder.weight

        def forward(self, x, h):
            y, h = self.rnn(self.drop(self.encoder(x)), h)
            return self.decoder(self.drop(y)), h

    class NeuMF(nn.Module):
        def __init__(self, users, items, factors, mlp, dropout):
            super().__init__()
            self.mf_user_embed = nn.Embedding(users, factors)
            self.mf_item_embed = nn.Embedding(items, factors)
            self.mlp_user_embed = nn.Embedding(users, mlp[0] // 2)
            self.mlp_item_embed = nn.Embedding(items, mlp[0] // 2)
            layers = []
            for a, b in zip(mlp[:-1], mlp[1:]):
                layers += [nn.Linear(a, b), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout > 0 else [])
            self.mlp = nn.Sequential(*layers)
            self.final = nn.Linear(factors + mlp[-1], 1)

        def forward(self, u, i):
            gmf = self.mf_user_embed(u) * self.mf_item_embed(i)
            m = self.mlp(torch.cat([self.mlp_user_embed(u), self.mlp_item_embed(i)], 1))
            return self.final(torch.cat([gmf, m], 1)).squeeze(1)

    if name == "resnet18-b32":
        model, B = ResNet18(), 32
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

        def step():
            x = torch.randn(B, 3, 32, 32)
            y = torch.randint(0, 10, (B,))
            return F.cross_entropy(model(x), y)
    elif name.startswith("lstm"):
        size, layers, drop, T = (650, 3, 0.4, 30) if "default" in name else (200, 2, 0.2, 20)
        model, B = LSTMLM(WIKITEXT2_VOCAB, size, layers, drop), 32
        opt = torch.optim.SGD(model.parameters(), lr=20)
        state = [None]

        def step():
            x = torch.randint(0, WIKITEXT2_VOCAB, (T, B))
            y = torch.randint(0, WIKITEXT2_VOCAB, (T * B,))
            h = state[0]
            out, h = model(x, h)
            state[0] = tuple(v.detach() for v in h)
            loss = F.cross_entropy(out.view(-1, WIKITEXT2_VOCAB), y)
            return loss
    else:
        if "default" in name:
            users, items, f, mlp, drop = 138493, 26744, 64, [256, 256, 128, 64], 0.5
        else:
            users, items, f, mlp, drop = 6040, 3706, 8, [64, 32, 16, 8], 0.0
        model, B = NeuMF(users, items, f, mlp, drop), 256
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            u = torch.randint(0, users, (B,))
            i = torch.randint(0, items, (B,))
            y = torch.randint(0, 2, (B,)).float()
            return F.binary_cross_entropy_with_logits(model(u, i), y)

    model.train()

    def train_step():
        opt.zero_grad(set_to_none=False)
        loss = step()
        loss.backward()
        if name.startswith("lstm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.4)
        opt.step()

    return train_step


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
