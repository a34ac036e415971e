#!/usr/bin/env python3
"""Optimizer offload side by side: step time and per-rank memory of ZeRO stage 2 with and
without zero_optimization.offload_optimizer, gpt-25m and gpt-100m at N ranks, in this one run.

The machine is shared and loaded, so the two settings are interleaved (off, on, off, on, ...)
and each repetition's ratio is taken between neighbours; the table gives the median of those
ratios next to the median times. On a CPU-only machine "device" and "host" are the same memory:
the engine's report still says which part would stay on a GPU and which moves to the host, and
the measured peak RSS (VmHWM, per rank) shows what the run really held. Offload keeps its own
fp32 master and a compute-dtype copy of the shard on the host, so on CPU its RSS is higher by
those; the column "RSS on - off" is compared with the report's difference of totals.

  python3 bench/optimizer_offload.py [--models gpt-25m gpt-100m] [--ranks 2] [--reps 3]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from benchlib import ROOT, mib, torchrun


def run(args, tmp, port, model, offload):
    summary = os.path.join(tmp, f"{model}{offload}.json")
    train = os.path.join(args.build, "examples", "zero-train")
    torchrun(args.ranks, port, [
        train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
        "--set", "zero_optimization.stage=2",
        "--set", f"zero_optimization.offload_optimizer.device={'cpu' if offload else 'none'}",
        "--set", "zero_optimization.offload_optimizer.pin_memory=false",
        # One core per rank (2 ranks, 2 cores): the CPU step's threads and torch's alike.
        "--set", "zero_optimization.offload_optimizer.threads=1",
        "--set", f"bf16.enabled={'true' if args.dtype == 'bf16' else 'false'}",
        "--set", f"trainer.model={model}",
        "--set", f"trainer.steps={args.steps}",
        "--set", f"trainer.seq_len={args.seq_len}",
        "--set", "train_micro_batch_size_per_gpu=1",
        "--set", "gradient_accumulation_steps=1",
        "--set", "steps_per_print=1000",
        "--summary-json", summary])
    return json.load(open(summary))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt-25m", "gpt-100m"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    runs = {(m, o): [] for m in args.models for o in (False, True)}
    port = 29900
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for model in args.models:
                for offload in (False, True):  # neighbours: the load they see is alike
                    port += 1
                    s = run(args, tmp, port, model, offload)
                    runs[(model, offload)].append(s)
                    print(f"bench: rep {rep} {model} offload={offload}: "
                          f"{s['step_seconds_median']:.3f} s/step, optimizer "
                          f"{s['optimizer_s_mean']:.3f} s, peak RSS "
                          f"{mib(max(s['peak_rss_bytes_per_rank'])):.0f} MiB", file=sys.stderr)

    lines = [f"ZeRO stage 2, {args.ranks} ranks (threads of the CPU step: 1 per rank, "
             f"OMP_NUM_THREADS=1), {args.dtype}, AdamW, micro-batch 1 x {args.seq_len} tokens, "
             f"{args.reps} interleaved repetitions (off, on, off, on, ...) of {args.steps} steps; "
             "step time = median over the steps after the first, then the median over "
             "repetitions; ratios are per repetition, between neighbouring runs, then the "
             "median. Memory per rank (rank 0): device / host is the engine's report "
             "(on CPU both are the same RAM); peak RSS is VmHWM, the max over ranks, "
             "median over repetitions.", "",
             "| model | offload | step (s) | vs off | optimizer step (s) | vs off | on device "
             "(MiB) | in host mem (MiB) | report total (MiB) | peak RSS (MiB) | RSS on - off "
             "(MiB) | report on - off (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out = []
    for model in args.models:
        off, on = runs[(model, False)], runs[(model, True)]
        for offload, group in ((False, off), (True, on)):
            med = lambda f: statistics.median(f(s) for s in group)
            step = med(lambda s: s["step_seconds_median"])
            opt = med(lambda s: s["optimizer_s_mean"])
            rss = med(lambda s: max(s["peak_rss_bytes_per_rank"]))
            mem = group[0]["memory"][0]
            total, host = mem["measured"]["total"], mem.get("host_measured", 0)
            step_ratio = statistics.median(a["step_seconds_median"] / b["step_seconds_median"]
                                           for a, b in zip(group, off))
            opt_ratio = statistics.median(a["optimizer_s_mean"] / b["optimizer_s_mean"]
                                          for a, b in zip(group, off))
            row = {"model": model, "num_params": group[0]["num_params"], "offload": offload,
                   "step_s": step, "step_vs_off": step_ratio, "optimizer_s": opt,
                   "optimizer_vs_off": opt_ratio, "device_bytes": total - host,
                   "host_bytes": host, "report_total_bytes": total, "peak_rss_bytes": rss,
                   "host_predicted_bytes": mem.get("host_predicted", 0),
                   "steps_s": [s["step_seconds_median"] for s in group]}
            if offload:
                base = out[-1]
                row["rss_delta_bytes"] = rss - base["peak_rss_bytes"]
                row["report_delta_bytes"] = total - base["report_total_bytes"]
            out.append(row)
            delta = (f"{mib(row['rss_delta_bytes']):+.0f} | {mib(row['report_delta_bytes']):+.0f}"
                     if offload else "- | -")
            lines.append(
                f"| {model} ({row['num_params'] / 1e6:.0f}M) | {'on' if offload else 'off'} | "
                f"{step:.3f} | {step_ratio:.2f}x | {opt:.3f} | {opt_ratio:.2f}x | "
                f"{mib(total - host):.0f} | {mib(host):.0f} | {mib(total):.0f} | {mib(rss):.0f} | "
                f"{delta} |")
    table = "\n".join(lines) + "\n"
    name = f"optimizer_offload_cpu{'' if args.dtype == 'fp32' else '_' + args.dtype}"
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    print(table)


if __name__ == "__main__":
    main()
