#!/usr/bin/env python3
"""ZeRO stage 3 with prefetch on (DeepSpeed's defaults: stage3_prefetch_bucket_size 5e7,
max_live_parameters 1e9, max_reuse_distance 1e9) against off (stage3_prefetch_bucket_size 0, the
same reuse distance), zero-train on gpt-25m fp32, N ranks through torchrun on the CPU (gloo).

The machine is shared and noisy: the two runs of a pair go back to back, in alternating order,
and only each pair's ratio is read. Per run: the summary's median step, and the all-gather wait
(rank 0's mean per step: at stage 3 the host time forward and backward waited for unit gathers,
plus the root's post-step gather), and the load average when the pair started.

  python3 bench/stage3_prefetch.py [--ranks 2 4] [--reps 3] [--steps 8] [--reuse 0]
                                   [--out-md bench/results/stage3_prefetch_cpu.md]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from benchlib import ROOT  # noqa: E402


def one(n, prefetch, a, port, tmp):
    out = os.path.join(tmp, f"s3-{n}-{prefetch}.json")
    argv = [os.path.join(a.build, "examples", "zero-train"),
            "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
            "--set", "zero_optimization.stage=3", "--set", "bf16.enabled=false",
            "--set", f"zero_optimization.stage3_prefetch_bucket_size={prefetch}",
            "--set", f"zero_optimization.stage3_max_reuse_distance={a.reuse}",
            "--set", f"trainer.model={a.model}", "--set", f"trainer.steps={a.steps}",
            "--set", f"trainer.seq_len={a.seq_len}",
            "--set", f"train_micro_batch_size_per_gpu={a.micro}",
            "--set", "gradient_accumulation_steps=1", "--set", "steps_per_print=100000",
            "--set", "no_weight_decay=[]", "--summary-json", out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    peers.run(n, port, argv, env, os.path.join(tmp, "rss.txt"))
    s = json.load(open(out))
    return {"step_s": s["step_seconds_median"], "wait_s": s.get("allgather_wait_s_mean") or 0.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--reuse", default="1000000000", help="stage3_max_reuse_distance (both runs)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out-md", default="")
    a = ap.parse_args()
    port = 29611
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.ranks:
            pairs = []
            for rep in range(a.reps):
                load = open("/proc/loadavg").read().split()[:3]
                order = [50000000, 0] if rep % 2 == 0 else [0, 50000000]
                got = {}
                for pf in order:
                    port += 1
                    got[pf] = one(n, pf, a, port, tmp)
                on, off = got[50000000], got[0]
                pairs.append((on, off, load))
                print(f"N={n} rep {rep}: on {on['step_s']:.3f} s (wait {on['wait_s']:.3f}), "
                      f"off {off['step_s']:.3f} s (wait {off['wait_s']:.3f}), "
                      f"on/off {on['step_s'] / off['step_s']:.3f}, load {' '.join(load)}",
                      flush=True)
            rows.append((n, pairs))
    lines = ["| N | rep | load (1/5/15 min) | step on (s) | step off (s) | on/off | "
             "all-gather wait on (s) | off (s) |", "|---|---|---|---|---|---|---|---|"]
    for n, pairs in rows:
        for i, (on, off, load) in enumerate(pairs):
            lines.append(f"| {n} | {i} | {' '.join(load)} | {on['step_s']:.3f} | "
                         f"{off['step_s']:.3f} | {on['step_s'] / off['step_s']:.3f} | "
                         f"{on['wait_s']:.3f} | {off['wait_s']:.3f} |")
        ratios = [on["step_s"] / off["step_s"] for on, off, _ in pairs]
        lines.append(f"| {n} | median | | | | **{statistics.median(ratios):.3f}** | "
                     f"{statistics.median(p[0]['wait_s'] for p in pairs):.3f} | "
                     f"{statistics.median(p[1]['wait_s'] for p in pairs):.3f} |")
    table = "\n".join(lines)
    print(table)
    if a.out_md:
        with open(a.out_md, "a") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
