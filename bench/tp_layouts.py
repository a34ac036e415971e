#!/usr/bin/env python3
"""Tensor parallelism on CPU/gloo, measured through zero-train (issue 23):

  1. memory per rank at T = 1, 2, 4 on 4 ranks (gpt-50m by default, fp32, ZeRO-1 on the
     data-parallel group): the engine's measured model states of rank 0 (parameters, gradients,
     optimizer states; the engine's report, summed from its buffers) beside the planner's
     prediction, and the host allocator's peak per phase (zero-train installs a counting
     allocator on CPU) beside the planner's figure for it (parallel_plan.hpp: the rank's shard
     and its share of the activations); a T the model's shape cannot take is listed with
     zero-train's error;
  2. step time of T = 2 against D = 2 at world size 2 (gpt-25m, the same global batch),
     interleaved repetitions, the median step of each (--skip-time: not run).

    python3 bench/tp_layouts.py [--reps 2] [--out bench/results/tp_layouts_cpu.md]
    python3 bench/tp_layouts.py --model gpt-100m --skip-time --out bench/results/tp_layouts_gpt100m_cpu.md
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "build" / "examples" / "zero-train"


def run(nproc, sets, summary, allow_failure=False):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--no-python", str(TRAIN), "--config", str(ROOT / "configs" / "zero2.yaml"),
           "--summary-json", str(summary)]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        if allow_failure:
            lines = [l for l in (p.stdout + p.stderr).splitlines() if "zero" in l and "autotp" in l]
            return {"error": lines[0].strip().replace(str(ROOT) + "/", "") if lines else "failed"}
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"tp_layouts: {' '.join(sets)} failed")
    return json.loads(Path(summary).read_text())


def mib(b):
    return f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tp_layouts_cpu.md"))
    ap.add_argument("--model", default="gpt-50m")
    ap.add_argument("--tp", default="1,2,4", help="tensor-parallel sizes of the memory table")
    ap.add_argument("--skip-time", action="store_true", help="memory only")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    lines = ["# Tensor parallelism on CPU/gloo: memory per rank and step time",
             "", "`python3 bench/tp_layouts.py` (zero-train, torchrun --no-python, gloo, one run per "
             "row; the machine has 2 shared cores, so times are ratios of neighbouring runs).", "",
             f"## Memory per rank, {a.model}, 4 ranks, fp32, ZeRO stage 1 on the data-parallel group, "
             "micro-batch 1 x 128 tokens, 2 steps", "",
             "| layout | parameters (MiB) | gradients | optimizer states | model states measured / "
             "predicted | host peak, forward / backward / step (MiB) | planner, forward / backward / "
             "step (MiB) |",
             "|---|---|---|---|---|---|---|"]
    common = [f"trainer.model={a.model}", "trainer.seq_len=128", "trainer.steps=2",
              "train_micro_batch_size_per_gpu=1", "gradient_accumulation_steps=1",
              "zero_optimization.stage=1", "steps_per_print=1", "gradient_clipping=1.0",
              "scheduler.params.total_num_steps=2", "scheduler.params.warmup_num_steps=1"]
    for t in (int(x) for x in a.tp.split(",")):  # gpt-50m: 8 heads, ffn 1536, vocab 8192 divide by 4
        s = run(4, common + [f"tensor_parallel.autotp_size={t}"], tmp / f"mem{t}.json",
                allow_failure=True)
        if "error" in s:
            lines.append(f"| tp {t} x dp {4 // t} | refused: {s['error']} | | | | | |")
            print(lines[-1], flush=True)
            continue
        m = s["memory"][0]
        me, pr = m["measured"], m["predicted"]
        pk = s.get("phase_peaks") or {}
        phases = ("forward", "backward", "step")
        peaks = " / ".join(mib((pk.get(k) or {}).get("measured") or 0) for k in phases)
        planned = " / ".join(mib((pk.get(k) or {}).get("predicted") or 0) for k in phases)
        lines.append(f"| tp {t} x dp {4 // t} | {mib(me['params'])} | {mib(me['grads'])} | "
                     f"{mib(me['optimizer'] + me.get('master', 0))} | {mib(me['total'])} / "
                     f"{mib(pr['total'])} | {peaks} | {planned} |")
        print(lines[-1], flush=True)
    if a.skip_time:
        Path(a.out).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return
    lines += ["", "Parameters per rank fall as 1/T (the RMSNorm weights stay whole on every rank). "
              "The gradient and optimizer-state shards stay put: ZeRO-1 shards each rank's Psi/T over "
              "D = 4/T data-parallel ranks, Psi/4 at every T (at T = 4 ZeRO shards nothing). The "
              "engine's measured model states equal its prediction for Psi/T; the host allocator's "
              "peaks (activations included) fall with them.", "",
              "## Step time, T = 2 against D = 2 at world size 2, gpt-25m, fp32, 4 sequences of 128 "
              "tokens per step", "",
              "| layout | median step (s), per repetition | tokens/s (median) |", "|---|---|---|"]
    base = ["trainer.model=gpt-25m", "trainer.seq_len=128", "trainer.steps=6", "train_batch_size=4",
            "train_micro_batch_size_per_gpu=2", "zero_optimization.stage=1", "steps_per_print=1",
            "scheduler.params.total_num_steps=6", "scheduler.params.warmup_num_steps=1"]
    times = {"tp 2 x dp 1": [], "tp 1 x dp 2": []}
    for r in range(a.reps):
        # The same 4 sequences per step: 2 micro-steps of 2 on the one data-parallel rank of
        # tp 2, one of 2 on each of the two of dp 2.
        for label, t in (("tp 2 x dp 1", 2), ("tp 1 x dp 2", 1)):
            s = run(2, base + [f"tensor_parallel.autotp_size={t}", f"gradient_accumulation_steps={t}"],
                    tmp / f"t{t}_{r}.json")
            times[label].append((s["step_seconds_median"], s["tokens_per_s_mean"]))
    for label, v in times.items():
        lines.append(f"| {label} | {', '.join(f'{x[0]:.3f}' for x in v)} | "
                     f"{statistics.median(x[1] for x in v):.0f} |")
    tp = statistics.median(x[0] for x in times["tp 2 x dp 1"])
    dp = statistics.median(x[0] for x in times["tp 1 x dp 2"])
    lines += ["", f"T = 2 / D = 2 step time: {tp / dp:.2f}x (each tensor-parallel rank runs half of "
              "every matmul on the whole batch and all-reduces activations 4 times per block; each "
              "data-parallel rank runs whole matmuls on half the batch and reduces gradients once)."]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
