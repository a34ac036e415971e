#!/usr/bin/env python3
"""The time model (include/zero/time_plan.hpp) against measured step times on this machine.

1. Calibrate, with N processes running at once as the trainer's N ranks do (torchrun gives each
   one OpenMP thread): the FLOP rate of the model's own matmul shapes (a forward's worth of
   [tokens x in] @ [in x out] products), the memory bandwidth of a large copy, and gloo's bus
   bandwidth per collective and its latency from build/bench/comm-bench at two payload sizes.
2. Predict the step time of each (model, N, stage) with build/tools/zero-memory fed those rates.
3. Measure it: build/examples/zero-train through torchrun, a few steps, the median after the
   first. The runs are interleaved (every configuration once per repetition) because other jobs
   share the machine; the figure is the median over repetitions.

  python3 bench/time_model.py [--models gpt-25m gpt-100m] [--ranks 2 4] [--reps 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, torchrun

# models/gpt.cpp's presets: dim, layers, vocab, tied.
PRESETS = {"gpt-25m": (384, 12, 8192, True), "gpt-50m": (512, 12, 8192, True),
           "gpt-100m": (640, 12, 32000, False)}

PROBE = r"""
import sys, time, torch
kind, tokens, shapes, seconds = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
if kind == "flops":
    x = {k: torch.randn(tokens, k) for k, _ in shapes}
    w = [(k, torch.randn(k, n)) for k, n in shapes]
    flops = sum(2 * tokens * k * n for k, n in shapes)
    run = lambda: [torch.mm(x[k], m) for k, m in w]
else:
    a, b = torch.randn(64 << 20 >> 2), torch.empty(64 << 20 >> 2)
    flops = 2 * a.numel() * 4  # bytes read + written
    run = lambda: b.copy_(a)
run()
best, t0 = [], time.perf_counter()
while time.perf_counter() - t0 < seconds:
    s = time.perf_counter(); run(); best.append(time.perf_counter() - s)
print(flops / sorted(best)[len(best) // 2])
"""


def concurrent_rate(n, kind, tokens, shapes, seconds=2.0):
    """Median per-process rate with n probes at once (one thread each, as torchrun sets)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", PROBE, kind, str(tokens), repr(shapes),
                               str(seconds)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    rates = [float(p.communicate()[0]) for p in procs]
    return statistics.median(rates)




def ffn_dim(dim):
    h = 2 * 4 * dim // 3
    return (h + 255) // 256 * 256


def matmul_shapes(model):
    dim, layers, vocab, _ = PRESETS[model]
    f = ffn_dim(dim)
    per_layer = [(dim, dim)] * 4 + [(dim, f), (dim, f), (f, dim)]
    return per_layer * layers + [(dim, vocab)]


def calibrate_comm(n, port, build):
    """Bus bandwidth per collective (NCCL's ring factors) and one latency, from two payloads."""
    comm = os.path.join(build, "bench", "comm-bench")
    sizes = [1 << 12, 1 << 22]  # fp32 elements, divisible by N
    small, large = (json.loads(torchrun(n, port + i, [comm, str(s)]).splitlines()[-1])
                    for i, s in enumerate(sizes))
    out = {}
    moved = {"all_reduce_s": 2, "reduce_scatter_s": 1, "all_gather_s": 1}
    for key, factor in moved.items():
        dt = max(large[key] - small[key], 1e-9)
        nbytes = 4 * (sizes[1] - sizes[0])
        out[key[:-2] + "_bw"] = factor * (n - 1) / n * nbytes / dt
    out["latency_s"] = min(small[k] for k in moved)
    return out


def predict(build, model, n, micro, seq, bucket, rates):
    argv = [os.path.join(build, "tools", "zero-memory"), "--model", model, "--gpus", str(n),
            "--micro-batch", str(micro), "--seq-len", str(seq), "--dtype", "fp32",
            "--bucket-size", str(bucket), "--device-memory", "1TB", "--json",
            "--peak-tflops", str(rates["flops"] / 1e12), "--efficiency", "1",
            "--memory-bw", str(rates["memory_bw"] / 1e9),
            "--all-reduce-bw", str(rates["all_reduce_bw"] / 1e9),
            "--reduce-scatter-bw", str(rates["reduce_scatter_bw"] / 1e9),
            "--all-gather-bw", str(rates["all_gather_bw"] / 1e9),
            "--latency-us", str(rates["latency_s"] * 1e6)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [s["time"] for s in json.loads(out)["stages"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt-25m", "gpt-100m"])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--bucket-size", type=int, default=500000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--budget-min", type=float, default=14,
                    help="skip a further repetition that would end after this many minutes")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    train = os.path.join(args.build, "examples", "zero-train")
    tokens = args.micro_batch * args.seq_len
    started = time.time()
    port = 29900

    rates, preds = {}, {}
    for n in args.ranks:
        port += 2
        c = calibrate_comm(n, port, args.build)
        for model in args.models:
            r = dict(c)
            r["flops"] = concurrent_rate(n, "flops", tokens, matmul_shapes(model))
            r["memory_bw"] = concurrent_rate(n, "copy", 0, [])
            rates[(model, n)] = r
            p = predict(args.build, model, n, args.micro_batch, args.seq_len, args.bucket_size, r)
            for s in args.stages:
                preds[(model, n, s)] = p[s]
            print(f"bench: calibrated N={n} {model}: {r['flops'] / 1e9:.1f} GFLOP/s, "
                  f"{r['memory_bw'] / 1e9:.1f} GB/s copy, all-reduce {r['all_reduce_bw'] / 1e9:.2f} / "
                  f"reduce-scatter {r['reduce_scatter_bw'] / 1e9:.2f} / all-gather "
                  f"{r['all_gather_bw'] / 1e9:.2f} GB/s, latency {r['latency_s'] * 1e6:.0f} us",
                  file=sys.stderr)

    configs = [(m, n, s) for m in args.models for n in args.ranks for s in args.stages]
    measured = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            rep_start = time.time()
            for (model, n, stage) in configs:
                port += 1
                summary = os.path.join(tmp, "s.json")
                torchrun(n, port, [
                    train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                    "--set", f"zero_optimization.stage={stage}",
                    "--set", f"zero_optimization.reduce_bucket_size={args.bucket_size}",
                    "--set", f"trainer.model={model}", "--set", f"trainer.steps={args.steps}",
                    "--set", f"trainer.seq_len={args.seq_len}",
                    "--set", f"train_micro_batch_size_per_gpu={args.micro_batch}",
                    "--set", "gradient_accumulation_steps=1", "--set", "steps_per_print=1000",
                    "--summary-json", summary])
                s = json.load(open(summary))
                measured[(model, n, stage)].append(s)
                print(f"bench: rep {rep} {model} N={n} stage {stage}: "
                      f"{s['step_seconds_median']:.3f} s/step (predicted "
                      f"{preds[(model, n, stage)]['step_s']:.3f})", file=sys.stderr)
            took = time.time() - rep_start
            if rep + 1 < args.reps and time.time() + took - started > 60 * args.budget_min:
                print(f"bench: stopping after {rep + 1} repetitions (time budget)", file=sys.stderr)
                break

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    lines = [
        f"Predicted (time model calibrated on this machine) vs measured step time: fp32, AdamW, "
        f"micro-batch {args.micro_batch} x {args.seq_len} tokens per rank, reduce_bucket_size "
        f"{args.bucket_size:,}, median of {args.steps - 1} steps after the first, median over "
        f"{len(next(iter(measured.values())))} interleaved repetitions. The ranks share 2 CPU cores with other jobs that "
        f"ran at the same time, so measured times are noisy. Wall time of the benchmark: "
        f"{(time.time() - started) / 60:.1f} min.", "",
        "| model | N | stage | compute pred / meas (s) | exposed gradient comm pred / meas (s) "
        "| optimizer + all-gather pred / meas (s) | step pred (s) | step meas (s) | error |",
        "|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for (model, n, stage) in configs:
        p, runs = preds[(model, n, stage)], measured[(model, n, stage)]
        meas = med(runs, "step_seconds_median")
        err = (p["step_s"] - meas) / meas
        errors.append(abs(err))
        comp = med(runs, "forward_s_mean") + med(runs, "backward_s_mean")
        lines.append(
            f"| {model} | {n} | {stage} | {p['forward_s'] + p['backward_s']:.3f} / {comp:.3f} | "
            f"{p['grad_comm_exposed_s']:.3f} / "
            f"{med(runs, 'comm_exposed_s_mean'):.3f} | {p['optimizer_s'] + p['param_gather_s']:.3f} / "
            f"{med(runs, 'optimizer_s_mean'):.3f} | {p['step_s']:.3f} | {meas:.3f} | "
            f"{100 * err:+.0f}% |")
    lines += ["", f"Mean absolute error {100 * statistics.mean(errors):.0f}%, largest "
              f"{100 * max(errors):.0f}%. The trainer times engine.step() as a whole, so the "
              "optimizer column holds the parameter all-gather of stages 1-2 on both sides.", "",
              "Calibrated rates (per rank, with N ranks running):", "",
              "| model | N | matmul GFLOP/s | copy GB/s | all-reduce GB/s | reduce-scatter GB/s "
              "| all-gather GB/s | latency (us) |", "|---|---|---|---|---|---|---|---|"]
    for (model, n), r in rates.items():
        lines.append(f"| {model} | {n} | {r['flops'] / 1e9:.1f} | {r['memory_bw'] / 1e9:.1f} | "
                     f"{r['all_reduce_bw'] / 1e9:.2f} | {r['reduce_scatter_bw'] / 1e9:.2f} | "
                     f"{r['all_gather_bw'] / 1e9:.2f} | {r['latency_s'] * 1e6:.0f} |")
    table = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "time_model.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
