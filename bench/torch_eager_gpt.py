#!/usr/bin/env python3
"""The example GPT in PyTorch eager (Python), trained the way zero trains it at world size 1:
bf16 weights for compute, fp32 master weights and AdamW states (torch's fused AdamW), optional
activation checkpointing per block (torch.utils.checkpoint, non-reentrant). The GPU check runs
it next to zero-train on the same GPU so the throughput ratio holds.

  python3 bench/torch_eager_gpt.py --dim 2048 --layers 24 --heads 16 --vocab 32000 \
      --seq-len 2048 --micro-batch 1 --steps 8 [--checkpointing] --out result.json
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()  # normalise in fp32, as the C++ model does
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Block(torch.nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.wq, self.wk, self.wv, self.wo = lin(dim, dim), lin(dim, dim), lin(dim, dim), lin(dim, dim)
        self.w_gate, self.w_up, self.w_down = lin(dim, ffn), lin(dim, ffn), lin(ffn, dim)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.attn_norm(x)
        split = lambda t: t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
        q, k, v = rope(split(self.wq(h)), cos, sin), rope(split(self.wk(h)), cos, sin), split(self.wv(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = x + self.wo(a.transpose(1, 2).reshape(B, T, D))
        m = self.mlp_norm(out)
        return out + self.w_down(F.silu(self.w_gate(m)) * self.w_up(m))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, dim, layers, heads, max_seq, ckpt, tied=False):
        super().__init__()
        ffn = (2 * 4 * dim // 3 + 255) // 256 * 256
        self.ckpt = ckpt
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        if tied:  # the C++ presets up to gpt-50m tie the output head to the embedding
            self.head.weight = self.embed.weight
        hd = dim // heads
        inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], -1).float()
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for b in self.blocks:
            x = checkpoint(b, x, cos, sin, use_reentrant=False) if self.ckpt else b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in (("dim", 2048), ("layers", 24), ("heads", 16), ("vocab", 32000),
                 ("seq-len", 2048), ("micro-batch", 1), ("steps", 8)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Gpt(a.vocab, a.dim, a.layers, a.heads, a.seq_len, a.checkpointing).to(dev)
    master = [p.detach().clone().float() for p in model.parameters()]
    model.to(torch.bfloat16)
    opt = torch.optim.AdamW(master, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    n = sum(p.numel() for p in master)
    # PaLM: 6N (the embedding lookup excluded) + 12 L H Q T, as examples/metrics.cpp
    flops_token = 6 * (n - a.vocab * a.dim) + 12 * a.layers * a.dim * a.seq_len
    times = []
    torch.cuda.reset_peak_memory_stats(dev)
    for step in range(a.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        x = torch.randint(a.vocab, (a.micro_batch, a.seq_len), device=dev)
        loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(m)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    med = sorted(times[1:])[len(times[1:]) // 2]
    tps = a.micro_batch * a.seq_len / med
    res = {"impl": "pytorch-eager", "checkpointing": a.checkpointing, "num_params": n,
           "step_s": med, "tokens_per_s": tps, "mfu": tps * flops_token / (a.peak_tflops * 1e12),
           "peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
           "final_loss": loss.item()}
    json.dump(res, open(a.out, "w"), indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
