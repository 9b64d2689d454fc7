"""The project's three models in PyTorch, for side-by-side measurements.

ResNet-18 (the CIFAR variant of the DEFT code), the LSTM language model
(tied, dropout on the embedding, between layers and on the output) and
NeuMF, each with its optimizer, as models/ builds them in Go. Used by
memory-torch.py (CPU memory) and gpu-step-torch.py (GPU step time).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

WIKITEXT2_VOCAB = 33278


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


class ResNet18(nn.Module):
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


def make_step(kind, batch, device="cpu", preset="default"):
    """Returns a function running one training step (zero_grad, forward,
    backward, clipping for the LSTM, optimizer step) on random data of the
    model's shapes, on device.

    kind: "resnet18", "lstm" or "ncf"; preset: the LSTM's "default"
    (3×650, BPTT 30) or "small" (2×200, BPTT 20), NCF's "default" (ml-20m
    sizes, 64 factors, MLP 256-256-128-64, dropout 0.5) or "paper" (ml-1m
    sizes, 8 factors, MLP 64-32-16-8)."""
    dev = torch.device(device)
    if kind == "resnet18":
        model = ResNet18().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        x = torch.randn(batch, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)

        def loss():
            return F.cross_entropy(model(x), y)
    elif kind == "lstm":
        size, layers, drop, T = (650, 3, 0.4, 30) if preset == "default" else (200, 2, 0.2, 20)
        model = LSTMLM(WIKITEXT2_VOCAB, size, layers, drop).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=20)
        x = torch.randint(0, WIKITEXT2_VOCAB, (T, batch), device=dev)
        y = torch.randint(0, WIKITEXT2_VOCAB, (T * batch,), device=dev)
        state = [None]

        def loss():
            out, h = model(x, state[0])
            state[0] = tuple(v.detach() for v in h)
            return F.cross_entropy(out.view(-1, WIKITEXT2_VOCAB), y)
    elif kind == "ncf":
        if preset == "default":
            users, items, f, mlp, drop = 138493, 26744, 64, [256, 256, 128, 64], 0.5
        else:
            users, items, f, mlp, drop = 6040, 3706, 8, [64, 32, 16, 8], 0.0
        model = NeuMF(users, items, f, mlp, drop).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        u = torch.randint(0, users, (batch,), device=dev)
        i = torch.randint(0, items, (batch,), device=dev)
        t = torch.randint(0, 2, (batch,), device=dev).float()

        def loss():
            return F.binary_cross_entropy_with_logits(model(u, i), t)
    else:
        raise ValueError(kind)
    model.train()

    def step():
        opt.zero_grad(set_to_none=False)
        loss().backward()
        if kind == "lstm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.4)
        opt.step()

    return step
