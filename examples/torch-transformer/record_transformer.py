"""A PyTorch Transformer language model on WikiText-2 whose gradients are
recorded for sparsegrad (python/sparsegrad_record.py): the example of
docs/results/transformer-recorded.md.

    python3 record_transformer.py --data PATH/wikitext-2 --out grads \
        --workers 16 --steps 3 --warmup 50

trains --warmup steps of plain single-process training first (the gradients
of a freshly initialised model are not typical), then records --workers
simulated workers over --steps steps. Needs only torch.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import sparsegrad_record  # noqa: E402


def tokens(path):
    """WikiText-2's tokens as sparsegrad reads them: white-space separated
    words, <eos> at every line end."""
    vocab, ids = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for w in line.split() + ["<eos>"]:
                ids.append(vocab.setdefault(w, len(vocab)))
    return torch.tensor(ids, dtype=torch.long), len(vocab)


class TransformerLM(nn.Module):
    def __init__(self, vocab, d=128, heads=4, layers=2, ff=512, seq=64, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, x):
        h = self.embed(x) * math.sqrt(self.embed.embedding_dim) + self.pos[: x.shape[1]]
        h = self.norm(self.encoder(h, mask=self.mask[: x.shape[1], : x.shape[1]]))
        return h @ self.embed.weight.t()  # tied decoder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder holding WikiText-2's training split (wiki.train.tokens or train.txt)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    names = [os.path.join(a.data, f) for f in ("wiki.train.tokens", "train.txt")]
    found = [p for p in names if os.path.exists(p)]
    if not found:
        sys.exit("no WikiText-2 training split in %s (looked for %s)" % (a.data, ", ".join(names)))
    ids, vocab = tokens(found[0])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = TransformerLM(vocab, seq=a.seq).to(device)
    n = sum(p.numel() for p in model.parameters())
    print("TransformerLM: %d parameters, vocabulary %d, %d training tokens, %s" % (n, vocab, len(ids), device))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(a.seed)
    loss_fn = nn.CrossEntropyLoss()

    def batch():
        starts = torch.randint(0, len(ids) - a.seq - 1, (a.batch,), generator=g)
        x = torch.stack([ids[s: s + a.seq] for s in starts])
        y = torch.stack([ids[s + 1: s + a.seq + 1] for s in starts])
        return x.to(device), y.to(device)

    def step():
        x, y = batch()
        opt.zero_grad()
        loss = loss_fn(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        return loss.item()

    t0 = time.time()
    for i in range(a.warmup):
        loss = step()
        opt.step()
        if (i + 1) % 10 == 0:
            print("warm-up step %d: loss %.3f (%.1f s)" % (i + 1, loss, time.time() - t0))
    # The two lines: a recorder, and capture() deciding when to step.
    rec = sparsegrad_record.Recorder(a.out, model, workers=a.workers, steps=a.steps, batch=a.batch, name="transformer-lm")
    while not rec.done:
        loss = step()
        if rec.capture():
            opt.step()
    print("recorded %d workers x %d steps into %s (step time %.3f s on %s)" % (
        a.workers, a.steps, a.out, rec.manifest["step_time"]["seconds"], rec.manifest["step_time"]["device"]))


if __name__ == "__main__":
    main()
