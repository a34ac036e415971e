#!/usr/bin/env python3
"""Stage times of the pipeline runtime with pipeline.partition parameters against compute.

zero-train (gpt-25m, fp32, AdamW, ZeRO stage 1, 1F1B, D = T = 1) at P = 2 and 4, each run once
per method in every repetition, the two methods one after the other so that they see the same
machine load. From --summary-json: each stage's layers and its mean forward and backward time per
step over the steps after the first (the runtime's time split, host clocks), and the median step.
Reported as ratios (the slowest stage's compute over the fastest's, compute's step over
parameters'), with the formula's (include/zero/pipeline_flops.hpp) beside them: on a shared 2-core
machine the absolute times say little.

  python3 bench/pipeline_partition.py [--stages 2 4] [--repeats 3] [--out bench/results/...]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchlib import ROOT, torchrun

METHODS = ["parameters", "compute"]


def run(build, args, p, method, port, tmp):
    summary = os.path.join(tmp, f"summary_{p}_{method}.json")
    argv = [os.path.join(build, "examples", "zero-train"),
            "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
            "--set", "zero_optimization.stage=1", "--set", f"trainer.model={args.model}",
            "--set", f"trainer.steps={args.steps}", "--set", f"trainer.seq_len={args.seq_len}",
            "--set", f"train_micro_batch_size_per_gpu={args.micro_batch}",
            "--set", f"gradient_accumulation_steps={args.micro_batches}",
            "--set", "steps_per_print=1", "--set", f"pipeline.stages={p}",
            "--set", f"pipeline.partition={method}", "--summary-json", summary]
    out = torchrun(p, port, argv)
    s = json.load(open(summary))
    lines = [ln for ln in out.splitlines() if ln.startswith("pipeline")]
    return s, lines


def load1():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m")
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "pipeline_partition_compute_cpu.md"))
    args = ap.parse_args()
    t0 = time.time()
    loads = [load1()]
    results = {}  # (p, method) -> list of (stage compute list, step s)
    layouts = {}
    port = 29731
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for p in args.stages:
                for method in METHODS:
                    port += 1
                    s, lines = run(args.build, args, p, method, port, tmp)
                    compute = [st["forward_s_mean"] + st["backward_s_mean"] for st in s["stages"]]
                    results.setdefault((p, method), []).append((compute, s["step_seconds_median"]))
                    layouts[(p, method)] = ([st["layers"] for st in s["stages"]], lines)
                    loads.append(load1())
                    print(f"rep {rep} P={p} {method}: stages {[round(c, 3) for c in compute]} s, "
                          f"step {s['step_seconds_median']:.3f} s", file=sys.stderr)

    def med(xs):
        return statistics.median(xs)

    rows = []
    for p in args.stages:
        per = {}
        for method in METHODS:
            runs = results[(p, method)]
            n = len(runs[0][0])
            stage = [med([r[0][i] for r in runs]) for i in range(n)]
            spread = [med([max(r[0]) / min(r[0]) for r in runs])]  # within each run
            per[method] = {"stage": stage, "imbalance": spread[0],
                           "step": med([r[1] for r in runs]),
                           "slowest": med([max(r[0]) for r in runs])}
        # compute's step over parameters' step, per repetition (the same load), then the median
        # and the range over the repetitions
        pairs = list(zip(results[(p, "compute")], results[(p, "parameters")]))
        steps = [c[1] / q[1] for c, q in pairs]
        slows = [max(c[0]) / max(q[0]) for c, q in pairs]
        rows.append((p, per, (med(steps), min(steps), max(steps)),
                     (med(slows), min(slows), max(slows))))

    with open(args.out, "w") as f:
        f.write(
            f"Stage times of the pipeline runtime, `pipeline.partition` parameters against compute "
            f"(`python3 bench/pipeline_partition.py`): {args.model}, fp32, AdamW, ZeRO stage 1, "
            f"1F1B, D = T = 1, {args.micro_batches} micro-batches of {args.micro_batch} x "
            f"{args.seq_len} tokens per step, {args.steps} steps per run (the first left out), "
            f"{args.repeats} repetitions with the two methods run back to back in each. A stage's "
            f"compute is its mean forward + backward seconds per step from zero-train's "
            f"--summary-json (the runtime's time split; host clocks). The P ranks share 2 CPU "
            f"cores with each other and with other jobs (1-minute load average "
            f"{min(loads):.1f} to {max(loads):.1f} during the runs; wall time "
            f"{(time.time() - t0) / 60:.1f} min), so absolute seconds are not the point: the ratios "
            f"are, each the median over repetitions of a ratio taken within one repetition.\n\n")
        f.write("| P | method | layers per stage | formula: stage FLOPs (blocks' worth) | "
                "measured stage compute (s) | slowest / fastest stage, formula / measured | "
                "step (s) |\n|---|---|---|---|---|---|---|\n")
        for p, per, ratio, slow in rows:
            for method in METHODS:
                bounds, _ = layouts[(p, method)]
                r = per[method]
                fl = stage_flops(args, bounds)
                f.write(f"| {p} | {method} | {' / '.join(f'{a}..{b}' for a, b in bounds)} | "
                        f"{formula(args, bounds)} | "
                        f"{' / '.join(f'{x:.3f}' for x in r['stage'])} | "
                        f"{max(fl) / min(fl):.2f} / {r['imbalance']:.2f} | {r['step']:.3f} |\n")
        f.write("\n| P | slowest stage, compute / parameters: formula | measured (range) | "
                "step, compute / parameters: measured (range) |\n|---|---|---|---|\n")
        for p, per, ratio, slow in rows:
            fp = max(stage_flops(args, layouts[(p, "parameters")][0]))
            fc = max(stage_flops(args, layouts[(p, "compute")][0]))
            f.write(f"| {p} | {fc / fp:.3f} | {slow[0]:.3f} ({slow[1]:.2f}-{slow[2]:.2f}) | "
                    f"{ratio[0]:.3f} ({ratio[1]:.2f}-{ratio[2]:.2f}) |\n")
        f.write("\nzero-train's start-up lines (the last repetition, compute):\n\n```\n")
        for p in args.stages:
            f.write("\n".join(layouts[(p, "compute")][1]) + "\n")
        f.write("```\n")
    print(open(args.out).read())


def layer_flops(args):
    # gpt-25m's layers as include/zero/pipeline_flops.hpp and include/zero/models/gpt_layers.hpp count them.
    shapes = {"gpt-25m": (8192, 384, 12, 1024), "gpt-50m": (8192, 512, 12, 1536)}
    v, h, n, f = shapes[args.model]
    block = 6 * (4 * h * h + 3 * h * f + 2 * h) + 12 * args.seq_len * h
    head = 6 * (v * h + h) + 8 * v
    return [h] + [block] * n + [head], block


def stage_flops(args, bounds):
    flops, _ = layer_flops(args)
    return [sum(flops[a:b + 1]) for a, b in bounds]


def formula(args, bounds):
    _, block = layer_flops(args)
    return " / ".join(f"{x / block:.2f}" for x in stage_flops(args, bounds))


if __name__ == "__main__":
    main()
