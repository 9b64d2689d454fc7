"""Records a small PyTorch Transformer with python/sparsegrad_record.py and
writes, beside each recording, the truth the Go test compares against: every
recorded gradient as raw little-endian float32 (torch's own conversion of
the recorded dtype), in the manifest's parameter order, as
truth/step-S-rank-R.f32. Usage: record_torch.py MODULE_DIR OUT_DIR
Recordings: OUT/f32, OUT/bf16, OUT/f16 (3 simulated workers, 2 steps) and
OUT/ddp (2 DDP ranks over gloo, 2 steps)."""

import copy
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, sys.argv[1])
import sparsegrad_record  # noqa: E402

OUT = sys.argv[2]
VOCAB, SEQ, BATCH = 50, 8, 4


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, VOCAB)
        self.unused = nn.Linear(3, 3)  # gets no gradient: recorded as zeros
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)  # left out

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def write_raw(path, tensors):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    flat = torch.cat([t.detach().float().reshape(-1) for t in tensors])
    n = flat.numel() * 4
    with open(path, "wb") as f:
        f.truncate(n)
    m = torch.from_file(path, shared=True, size=n, dtype=torch.uint8)
    m.copy_(flat.view(torch.uint8))
    del m


def batch(g):
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, torch.roll(x, -1, 1)


def simulated(name, dtype):
    torch.manual_seed(1)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = os.path.join(OUT, name)
    rec = sparsegrad_record.Recorder(out, model, workers=3, steps=2, batch=BATCH, name="tinylm", dtype=dtype,
                                     steps_per_epoch=7)
    g = torch.Generator().manual_seed(2)
    step, worker, grads = 1, 0, []
    for it in range(9):  # 2 steps of 3 workers, then plain training
        x, y = batch(g)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if step <= 2:
            mine = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in rec.params]
            rounded = [t.to(dtype) if dtype is not None else t.clone() for t in mine]
            write_raw(os.path.join(out, "truth", "step-%d-rank-%d.f32" % (step, worker)), rounded)
            grads.append([t.clone() for t in mine])
        stepped = rec.capture()
        if step <= 2:
            worker += 1
            assert stepped == (worker == 3), (it, stepped)
            if stepped:
                for i, (_, p) in enumerate(rec.params):
                    mean = sum(w[i] for w in grads) / 3
                    assert torch.allclose(p.grad, mean, atol=1e-7), "the update's gradient is not the workers' mean"
                step, worker, grads = step + 1, 0, []
        else:
            assert stepped, "capture() after the recording must return True"
        if stepped:
            opt.step()
    assert rec.done


def ddp_rank(rank, world):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("RECORD_TEST_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    inner = TinyLM()
    model = nn.parallel.DistributedDataParallel(inner, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = os.path.join(OUT, "ddp")
    rec = sparsegrad_record.Recorder(out, model, steps=2, batch=BATCH, name="tinylm")
    g = torch.Generator().manual_seed(10 + rank)
    for step in (1, 2, 3):
        x, y = batch(g)
        if step <= 2:
            ref = copy.deepcopy(inner)  # this rank's own gradient, without DDP
            loss_of(ref, x, y).backward()
            write_raw(os.path.join(out, "truth", "step-%d-rank-%d.f32" % (step, rank)),
                      [p.grad if p.grad is not None else torch.zeros_like(p) for n, p in ref.named_parameters() if p.requires_grad])
        opt.zero_grad()
        loss_of(model, x, y).backward()
        assert rec.capture()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    simulated("f32", None)
    simulated("bf16", torch.bfloat16)
    simulated("f16", torch.float16)
    import torch.multiprocessing as mp
    mp.spawn(ddp_rank, args=(2,), nprocs=2, join=True)
    print("recorded")
