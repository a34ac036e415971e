#!/usr/bin/env python3
"""The memory planner against a real run: zero-memory's per-rank model-state bytes next to what
zero-train's engine holds, for ZeRO stages 0/1/2 at 2 and 4 ranks on CPU.

Each row must agree within 5% (PASS/FAIL); the table goes to bench/results/memory_compare.md.
With torch importable in Python, the per-block activation formula is also checked against the
bytes autograd saves for a replica of the example block (saved_tensors_hooks).

  python3 bench/memory_compare.py [--ranks 2 4] [--dtypes fp32 bf16] [--grad-accum model|fp32]
                                  [--svg [FILE]]

--grad-accum: data_types.grad_accum_dtype of the runs (the preset sets fp32); `model` (default)
is DeepSpeed's default, the model dtype: under bf16 the gradient shard is kept in bf16.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "zero2.yaml")
CATEGORIES = [("params", "parameters"), ("grads", "gradients"), ("master", "fp32 master"),
              ("optimizer", "optimizer states"), ("comm_buffers", "bucket buffers")]
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9"]  # as zero/plan/memory_svg.cpp
TOLERANCE = 0.05


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"memory_compare: {' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n"
                 f"{res.stderr[-3000:]}")
    return res.stdout


def bucket_size():
    """reduce_bucket_size of the config the runs use: the planner must be told the same."""
    m = re.search(r"^\s*reduce_bucket_size:\s*([0-9.eE+]+)", open(CONFIG).read(), re.M)
    return m.group(1) if m else "5e8"


def accum_dtype(dtype, grad_accum):
    return dtype if grad_accum == "model" else "fp32"


def measure(train, n, stage, dtype, model, port, tmp, grad_accum):
    summary = os.path.join(tmp, f"n{n}s{stage}{dtype}.json")
    cmd = ["torchrun", "--no-python", "--standalone", f"--nproc-per-node={n}",
           f"--master-port={port}", train, "--config", CONFIG,
           "--set", f"zero_optimization.stage={stage}", "--set", f"trainer.model={model}",
           "--set", "trainer.steps=2", "--set", "steps_per_print=1000",
           "--set", f"data_types.grad_accum_dtype={accum_dtype(dtype, grad_accum)}",
           "--summary-json", summary]
    if dtype == "bf16":
        cmd[-2:-2] = ["--set", "bf16.enabled=true"]
    run(cmd)
    return json.load(open(summary))


def plan(tool, n, dtype, model, seq_len, grad_accum):
    g = 4 if accum_dtype(dtype, grad_accum) == "fp32" else 2
    out = run([tool, "--model", model, "--gpus", str(n), "--dtype", dtype,
               "--bucket-size", bucket_size(), "--seq-len", str(seq_len),
               "--grad-accum-bytes", str(g), "--json"])
    return json.loads(out)


def saved_block_bytes(torch, dtype, b, s, h, a, f):
    """Bytes autograd keeps for one example block (models/gpt.cpp), weights excluded."""
    F = torch.nn.functional
    w = lambda i, o: (torch.randn(o, i) * 0.02).to(dtype).requires_grad_()
    wq, wk, wv, wo, wg, wu, wd = w(h, h), w(h, h), w(h, h), w(h, h), w(h, f), w(h, f), w(f, h)
    n1, n2 = (torch.ones(h, dtype=dtype, requires_grad=True) for _ in range(2))
    hd = h // a
    cos, sin = torch.randn(s, hd).to(dtype), torch.randn(s, hd).to(dtype)

    def rms(x, g):
        xf = x.to(torch.float32)
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * g

    def rope(x):
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    seen = {}

    def pack(t):  # storages, not tensors: views of one buffer are kept once
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hh = rms(x, n1)
        split = lambda t: t.view(b, s, a, hd).transpose(1, 2)
        q, k = rope(split(F.linear(hh, wq))), rope(split(F.linear(hh, wk)))
        v = split(F.linear(hh, wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = x + F.linear(o.transpose(1, 2).reshape(b, s, h), wo)
        m = rms(out, n2)
        _ = out + F.linear(F.silu(F.linear(m, wg)) * F.linear(m, wu), wd)
    weights = {t.untyped_storage().data_ptr()
               for t in (wq, wk, wv, wo, wg, wu, wd, n1, n2, cos, sin)}
    return sum(v for k, v in seen.items() if k not in weights)


def activation_rows(tool):
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    rows = []
    # (b, s, h, heads, ffn): a hand-checked shape, and the "small" preset at zero-train's shape.
    for b, s, h, a, f in [(2, 64, 128, 4, 352), (8, 64, 192, 6, 512)]:
        for dtype, tdtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out = run([tool, "--params", "1e6", "--layers", "1", "--hidden", str(h), "--heads",
                       str(a), "--ffn", str(f), "--vocab", "256", "--micro-batch", str(b),
                       "--seq-len", str(s), "--dtype", dtype, "--json"])
            predicted = json.loads(out)["block_activation_bytes"]
            rows.append((f"b={b} s={s} h={h} a={a} f={f}", dtype, predicted,
                         saved_block_bytes(torch, tdtype, b, s, h, a, f)))
    return rows


def svg_chart(runs, path):
    """Measured per-rank bytes as stacked bars, the planner's total as a black tick."""
    top = max(max(m["measured"]["total"], p["total"]) for _, m, p in runs) * 1.15
    left, plot_top, plot_h, bar_w, gap = 80, 70, 360, 70, 36
    plot_w = gap + len(runs) * (bar_w + gap)
    width, height = left + plot_w + 220, plot_top + plot_h + 60
    y = lambda v: plot_top + plot_h - v / top * plot_h
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
         f'<text x="{left}" y="24" font-size="16" font-weight="bold">Measured per-rank model '
         'states, zero-train on CPU</text>',
         f'<text x="{left}" y="44" fill="#444">bars: what the engine holds (rank 0); black tick: '
         'zero-memory\'s prediction</text>']
    p = 10 ** math.floor(math.log10(top / 1e6))  # ticks 1, 2 or 5 x 10^k MB apart, <= 8
    step = next(m * p for m in (0.1, 0.2, 0.5, 1, 2, 5, 10) if top / 1e6 / (m * p) <= 8)
    v = 0.0
    while v * 1e6 <= top:
        o.append(f'<line x1="{left}" y1="{y(v * 1e6):.1f}" x2="{left + plot_w}" '
                 f'y2="{y(v * 1e6):.1f}" stroke="#ddd"/><text x="{left - 6}" '
                 f'y="{y(v * 1e6) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    o.append(f'<text x="20" y="{plot_top + plot_h // 2}" transform="rotate(-90 20 '
             f'{plot_top + plot_h // 2})" text-anchor="middle">per-rank memory (MB)</text>')
    for i, (label, measured, predicted) in enumerate(runs):
        x, base = left + gap + i * (bar_w + gap), 0
        for c, (key, name) in enumerate(CATEGORIES):
            b = measured["measured"][key]
            if b <= 0:
                continue
            o.append(f'<rect x="{x}" y="{y(base + b):.2f}" width="{bar_w}" '
                     f'height="{b / top * plot_h:.2f}" fill="{COLOURS[c]}"><title>{label} '
                     f'{name}: {b} bytes</title></rect>')
            base += b
        t = y(predicted["total"])
        o.append(f'<line x1="{x - 6}" y1="{t:.1f}" x2="{x + bar_w + 6}" y2="{t:.1f}" '
                 f'stroke="#000" stroke-width="2"/>')
        o.append(f'<text x="{x + bar_w / 2}" y="{y(base) - 6:.1f}" text-anchor="middle">'
                 f'{base / 1e6:.1f}</text><text x="{x + bar_w / 2}" y="{plot_top + plot_h + 18}" '
                 f'text-anchor="middle">{label}</text>')
    o.append(f'<line x1="{left}" y1="{plot_top + plot_h}" x2="{left + plot_w}" '
             f'y2="{plot_top + plot_h}" stroke="#000"/>')
    for c, (_, name) in enumerate(reversed(CATEGORIES)):
        cy = plot_top + 10 + c * 22
        o.append(f'<circle cx="{left + plot_w + 30}" cy="{cy}" r="7" '
                 f'fill="{COLOURS[len(CATEGORIES) - 1 - c]}"/><text x="{left + plot_w + 44}" '
                 f'y="{cy + 4}">{name}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--svg", nargs="?", const="", default=None,
                    help="write the measured chart (default: <out>/memory_compare.svg)")
    ap.add_argument("--no-activations", action="store_true")
    ap.add_argument("--grad-accum", choices=["model", "fp32"], default="model",
                    help="data_types.grad_accum_dtype: the model dtype (DeepSpeed's default) or fp32")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train = os.path.join(args.build, "examples", "zero-train")
    tool = os.path.join(args.build, "tools", "zero-memory")

    rows, chart_runs, port = [], [], 29850
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            for n in args.ranks:
                p = plan(tool, n, dtype, args.model, 64, args.grad_accum)
                for stage in (0, 1, 2):
                    port += 1
                    s = measure(train, n, stage, dtype, args.model, port, tmp, args.grad_accum)
                    predicted = p["stages"][stage]["model_states"]
                    # Every rank must match, not only rank 0: report the worst.
                    err = max(abs(r["measured"]["total"] - predicted["total"]) /
                              r["measured"]["total"] for r in s["memory"])
                    rows.append((dtype, n, stage, s["memory"][0]["measured"], predicted, err))
                    if dtype == args.dtypes[0]:
                        chart_runs.append((f"N={n} s{stage}", s["memory"][0], predicted))
                    print(f"memory_compare: {dtype} N={n} stage {stage}: error {100 * err:.3f}%",
                          file=sys.stderr)

    mb = lambda b: f"{b / 1e6:.3f}"
    lines = [f"Model `{args.model}`, {os.path.relpath(CONFIG, ROOT)} (reduce_bucket_size "
             f"{bucket_size()}), data_types.grad_accum_dtype "
             f"{'the model dtype' if args.grad_accum == 'model' else 'fp32'}, 2 steps on CPU. Per-rank model-state bytes in MB (10^6): what "
             "zero-train's engine holds (rank 0) vs what `zero-memory --json` predicts "
             "before any allocation; the error is the worst rank's, on the total.", "",
             "| dtype | N | stage | " + " | ".join(f"{n} meas / pred" for _, n in CATEGORIES) +
             " | total measured | total predicted | error | within 5% |",
             "|---|---|---|" + "---|" * (len(CATEGORIES) + 4)]
    failed = 0
    for dtype, n, stage, m, p, err in rows:
        ok = err <= TOLERANCE
        failed += not ok
        cells = " | ".join(f"{mb(m[k])} / {mb(p[k])}" for k, _ in CATEGORIES)
        lines.append(f"| {dtype} | {n} | {stage} | {cells} | {mb(m['total'])} | "
                     f"{mb(p['total'])} | {100 * err:.3f}% | {'PASS' if ok else 'FAIL'} |")
    acts = None if args.no_activations else activation_rows(tool)
    if acts:
        lines += ["", "Activations of one block: `block_activation_bytes` vs the bytes autograd "
                  "saves for a PyTorch replica of models/gpt.cpp's block "
                  "(torch.autograd.graph.saved_tensors_hooks, storages counted once, weights "
                  "excluded):", "",
                  "| shape | dtype | predicted (bytes) | saved by autograd | error | within 5% |",
                  "|---|---|---|---|---|---|"]
        for shape, dtype, pred, meas in acts:
            err = abs(pred - meas) / meas
            failed += err > TOLERANCE
            lines.append(f"| {shape} | {dtype} | {pred} | {meas} | {100 * err:.3f}% | "
                         f"{'PASS' if err <= TOLERANCE else 'FAIL'} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "memory_compare.md"), "w") as f:
        f.write(table)
    if args.svg is not None:
        path = args.svg or os.path.join(args.out, "memory_compare.svg")
        svg_chart(chart_runs, path)
        print(f"memory_compare: wrote {path}", file=sys.stderr)
    print(table)
    print("memory_compare: " + ("all rows PASS" if not failed else f"{failed} rows FAIL"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
