"""Record the gradients of any PyTorch training for sparsegrad.

sparsegrad judges gradient sparsifiers (DEFT, MiCRO, Top-k, ...) on the
gradients of your own model: record P workers' gradients over S steps with
this module (it needs only torch), then

    train replay -gradients DIR -sparsifier deft -density 0.01 -out runs/deft
    train advise -gradients DIR -workers 16,64,256 -net-bandwidth 10,100

Two lines in your training script, one worker per mini-batch:

    import sparsegrad_record
    rec = sparsegrad_record.Recorder("grads", model, workers=4, steps=10, batch=64)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        if rec.capture():      # instead of stepping after every batch
            optimizer.step()

Simulated workers (a plain model): P consecutive mini-batches are the P
workers of one step. capture() copies each one's gradient (and clears it);
after the P-th it puts the workers' mean gradient in .grad and returns True,
so the optimizer steps once per P batches -- data-parallel training of P
workers, as gradient accumulation does. After S steps recording stops and
capture() returns True after every batch (and changes nothing).

A DistributedDataParallel job: wrap the model first and pass the DDP model;
every rank records its own gradient before DDP's all-reduce (a gradient
hook on each parameter, summed over the backward passes between captures
as DDP's no_sync() accumulation sums them; the hooks are removed when
recording ends, and a comm hook of your own stays free), P is the world size, and capture() always returns True. The ranks must share
the output folder, or have theirs merged before replaying.

What is written: DIR/manifest.json (the model's parameters in order with
their shapes and offsets, P, S, the batch, the measured time of one
worker's forward and backward pass with its device, the versions) and one
safetensors file per worker and step, DIR/step-000001/rank-00000.safetensors,
holding one tensor per parameter (named as model.named_parameters() names
it, "module." dropped under DDP). Parameters without requires_grad are left
out; a parameter that gets no gradient in a step is recorded as zeros.

Cost: each capture copies the gradient to host memory and writes it; the
folder takes P x S x (parameters x bytes per element): float32 ResNet-50
(25.6 M parameters) is about 100 MB per worker and step, so 16 workers x 10
steps is 16 GB. dtype=torch.bfloat16 or torch.float16 halves that (the
values are rounded). steps_per_epoch=len(loader) // P (optional) lets a
replay run epoch-based schedules, DGC's density warm-up, as training would.

The step time is measured from the model's forward call to capture() (the
loss and backward included, CUDA synchronised at both ends), one sample per
batch; the manifest's is the median after the first. Under DDP it includes
the all-reduce's wait; record on one GPU without DDP for the compute alone.
"""

import json
import math
import os
import platform
import sys
import time

import torch

__all__ = ["Recorder", "FORMAT", "VERSION"]

FORMAT = "sparsegrad-gradients"
VERSION = 1
FILES = "step-%06d/rank-%05d.safetensors"

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


def _write_safetensors(path, named, metadata=None):
    """Writes tensors [(name, tensor)] as a safetensors file, in that order,
    through a temporary file renamed at the end."""
    if sys.byteorder != "little":
        raise RuntimeError("sparsegrad_record writes little-endian data; this machine is big-endian")
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    flat = []
    for name, t in named:
        t = t.detach()
        if t.dtype not in _DTYPES:
            raise TypeError("tensor %s has dtype %s; record float32, float16, bfloat16 or float64" % (name, t.dtype))
        n = t.numel() * _SIZES[_DTYPES[t.dtype]]
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        flat.append((off, n, t))
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)  # align the data to 8 bytes
    start = 8 + len(hb)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        f.truncate(start + off)
    if off > 0:
        # The data through a shared mapping of the file: no numpy needed.
        mapped = torch.from_file(tmp, shared=True, size=start + off, dtype=torch.uint8)
        for o, n, t in flat:
            if n:
                mapped[start + o:start + o + n].copy_(t.contiguous().cpu().reshape(-1).view(torch.uint8))
        del mapped
    os.replace(tmp, path)


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _median(v):
    v = sorted(v)
    if not v:
        return 0.0
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def _device_name(model):
    for p in model.parameters():
        d = p.device
        if d.type == "cuda":
            return "%s (%s)" % (d, torch.cuda.get_device_name(d))
        return str(d)
    return "cpu"


class Recorder:
    """Records the gradients of `workers` simulated workers (or of the ranks
    of a DistributedDataParallel model) over `steps` steps into folder
    `out`. See the module's doc."""

    def __init__(self, out, model, workers=None, steps=10, batch=0, name=None, dtype=None, steps_per_epoch=0):
        if steps < 1:
            raise ValueError("steps=%r: record at least one step" % (steps,))
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError("dtype=%r: use torch.float32, torch.float16 or torch.bfloat16" % (dtype,))
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self.out, self.steps, self.dtype, self.ddp = out, steps, dtype, ddp
        inner = model.module if ddp else model
        if ddp:
            import torch.distributed as dist
            self.rank, self.workers = dist.get_rank(), dist.get_world_size()
            if workers not in (None, self.workers):
                raise ValueError("workers=%r, but the DDP job has %d ranks: leave workers out" % (workers, self.workers))
        else:
            if workers is None or workers < 1:
                raise ValueError("workers=%r: give the number of workers to simulate (e.g. workers=4)" % (workers,))
            self.rank, self.workers = 0, workers
        self.params = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no parameter that requires a gradient")
        manifest = os.path.join(out, "manifest.json")
        if self.rank == 0 and os.path.exists(manifest):
            raise FileExistsError("%s already holds a recording; record into another folder or delete it" % out)
        os.makedirs(out, exist_ok=True)
        self.step = 1          # the step being recorded (from 1)
        self.worker = 0        # simulated: the worker whose batch comes next
        self.done = False
        self.times = []
        self._t0 = None
        self._sum = None
        self._local = {}
        offset, params = 0, []
        for n, p in self.params:
            dt = _DTYPES[dtype or p.dtype] if (dtype or p.dtype) in _DTYPES else "F32"
            params.append({"name": n, "shape": list(p.shape), "offset": offset, "size": p.numel(), "dtype": dt})
            offset += p.numel()
        self.manifest = {
            "format": FORMAT, "version": VERSION, "model": name or type(inner).__name__, "source": "pytorch",
            "mode": "ddp" if ddp else "simulated", "workers": self.workers, "steps": 0, "batch": int(batch or 0),
            "steps_per_epoch": int(steps_per_epoch or 0),
            "step_time": {"seconds": 0.0, "device": _device_name(inner)},
            "params": params, "n": offset, "files": FILES,
            "software": {"torch": torch.__version__, "python": platform.python_version(), "sparsegrad_record": str(VERSION)},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self._hooks = [model.register_forward_pre_hook(self._forward_starts)]
        if ddp:
            self._hooks += [p.register_hook(self._local_grad(p)) for _, p in self.params]

    # -- timing --------------------------------------------------------
    def _sync(self):
        dev = self.params[0][1].device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def _forward_starts(self, module, inputs):
        if self._t0 is None and not self.done:
            self._sync()
            self._t0 = time.perf_counter()

    # -- DDP ----------------------------------------------------------
    def _local_grad(self, p):
        """A hook that keeps p's gradient of this rank's backward pass. It
        runs in autograd, before the gradient reaches .grad and DDP's
        all-reduce. (A DDP comm hook written in Python, as the recorder
        used, can deadlock torch 1.13 when the DDP model is freed: the
        process group's destructor joins, holding the GIL, a gloo thread
        that waits for the GIL to finish the hook's future.)"""
        key = id(p)

        def hook(g):
            if not self.done:
                prev = self._local.get(key)
                self._local[key] = g.detach().clone() if prev is None else prev + g.detach()
            return None
        return hook

    # -- recording ----------------------------------------------------
    def _grads(self):
        out = []
        for n, p in self.params:
            g = self._local.get(id(p)) if self.ddp else p.grad
            if g is None:
                g = torch.zeros_like(p)
            out.append((n, g))
        return out

    def _write(self, grads):
        path = os.path.join(self.out, FILES % (self.step, self.rank if self.ddp else self.worker))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        named = [(n, g.to(self.dtype) if self.dtype is not None else g) for n, g in grads]
        _write_safetensors(path, named)

    def _commit(self, steps):
        samples = self.times
        self.manifest["steps"] = steps
        self.manifest["step_time"]["seconds"] = _median(samples[1:] if len(samples) > 1 else samples)
        self.manifest["step_time"]["samples"] = samples
        if self.ddp:
            self.manifest["step_time"]["note"] = "forward to the end of backward, DDP's all-reduce wait included"
        _write_json(os.path.join(self.out, "manifest.json"), self.manifest)

    def capture(self):
        """Call after each batch's backward pass. Returns True when the
        optimizer should step (see the module's doc)."""
        if self.done:
            return True
        self._sync()
        if self._t0 is not None:
            self.times.append(time.perf_counter() - self._t0)
            self._t0 = None
        grads = self._grads()
        for _, g in grads:
            if not torch.isfinite(g).all():
                raise FloatingPointError("a gradient of step %d is not finite; nothing of this step was kept" % self.step)
        self._write(grads)
        if self.ddp:
            self._local = {}
            if self.rank == 0 and self.step > 1:
                self._commit(self.step - 1)  # every rank has written step-1 (they met in this step's all-reduce)
            if self.step == self.steps:
                import torch.distributed as dist
                dist.barrier()
                if self.rank == 0:
                    self._commit(self.step)
                self._finish()
            self.step += 1
            return True
        # Simulated workers: sum the workers' gradients, clear this one's.
        with torch.no_grad():
            if self._sum is None:
                self._sum = [g.detach().clone().float() for _, g in grads]
            else:
                for s, (_, g) in zip(self._sum, grads):
                    s.add_(g.float())
            for _, p in self.params:
                p.grad = None
        self.worker += 1
        if self.worker < self.workers:
            return False
        with torch.no_grad():
            for s, (_, p) in zip(self._sum, self.params):
                p.grad = (s / self.workers).to(p.dtype)
        self._sum = None
        self.worker = 0
        self._commit(self.step)
        if self.step == self.steps:
            self._finish()
        self.step += 1
        return True

    def _finish(self):
        self.done = True
        for h in self._hooks:
            h.remove()
