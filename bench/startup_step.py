#!/usr/bin/env python3
"""Start-up memory and the exposed parameter all-gather, two builds side by side in one run.

For each build (label=path to a zero-train binary) and each dtype/stage, trains `--steps` steps
of `--model` on N ranks through torchrun and reads the summary JSON: the peak RSS of model
creation + zero::initialize (VmHWM right after initialize), the RSS right after it (the engine's
buffers allocated: the steady state of model states), the run's peak RSS, all max over ranks;
the median step time, the optimizer part of it and the all-gather wait that step() did not hide.
Runs are interleaved (build A, build B, A, B ...) so load on a shared machine hits both alike.

  python3 bench/startup_step.py --build before=/tmp/zero-train-before after=build/examples/zero-train
"""
import argparse
import json
import os
import sys
import tempfile

from benchlib import ROOT, torchrun




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", nargs="+", required=True, help="label=path/to/zero-train")
    ap.add_argument("--model", default="gpt-100m")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    port, rows = 29800, []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for dtype in args.dtypes:
                for stage in args.stages:
                    for label, path in builds:
                        port += 1
                        out = os.path.join(tmp, f"{label}-{dtype}-{stage}-{rep}.json")
                        torchrun(args.ranks, port, [
                            path, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                            "--set", f"zero_optimization.stage={stage}",
                            "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}",
                            "--set", f"trainer.model={args.model}",
                            "--set", f"trainer.steps={args.steps}",
                            "--set", f"scheduler.params.total_num_steps={args.steps}",
                            "--set", "scheduler.params.warmup_num_steps=1",
                            "--set", "trainer.seq_len=64",
                            "--set", "train_micro_batch_size_per_gpu=1",
                            "--set", "gradient_accumulation_steps=1",
                            "--set", "steps_per_print=1000", "--summary-json", out])
                        s = json.load(open(out))
                        s.update(label=label, dtype=dtype)
                        rows.append(s)
                        print(f"bench: {label} {dtype} stage {stage}: start-up peak "
                              f"{s['startup_peak_rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
    mib = lambda b: b / 2**20
    print(f"`{args.model}` ({rows[0]['num_params']:,} parameters), {args.ranks} ranks, "
          f"{args.steps} steps, medians over {args.repeats} interleaved repetition(s); "
          "memory is max over ranks.\n")
    print("| build | dtype | stage | start-up peak RSS | RSS after initialize | peak / after "
          "| run peak RSS | step (s) | optimizer (s) | exposed all-gather (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = lambda v: sorted(v)[len(v) // 2]
    for dtype in args.dtypes:
        for stage in args.stages:
            for label, _ in builds:
                g = [r for r in rows if r["label"] == label and r["dtype"] == dtype
                     and r["stage"] == stage]
                peak = med([r["startup_peak_rss_bytes"] for r in g])
                after = med([r["rss_after_initialize_bytes"] for r in g])
                print(f"| {label} | {dtype} | {stage} | {mib(peak):.0f} MiB | {mib(after):.0f} MiB "
                      f"| {peak / after:.2f}x | {mib(med([r['peak_rss_bytes'] for r in g])):.0f} MiB "
                      f"| {med([r['step_seconds_median'] for r in g]):.3f} "
                      f"| {med([r['optimizer_s_mean'] for r in g]):.3f} "
                      f"| {med([r['allgather_wait_s_mean'] for r in g]):.3f} |")


if __name__ == "__main__":
    main()
