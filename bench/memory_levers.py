#!/usr/bin/env python3
"""The memory levers side by side: {no checkpointing, checkpointing, checkpointing + CPU offload}
x {fp32, bf16} on the example GPT, one rank each, all in this one run.

Reports the process's peak resident memory (on CPU that is where activations live), the step
time and its ratio to the same precision without checkpointing, and the bytes the offloader
moved to host memory. On a CPU-only machine "offload" copies host to host: its memory column
cannot drop and its time is pure overhead; the host-bytes column is what would leave the GPU.
Full recomputation costs one extra forward, 2N of the 6N FLOPs per token: ~33% in theory.

  python3 bench/memory_levers.py [--model gpt-25m] [--micro-batch 8] [--seq-len 256] [--steps 4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train = os.path.join(args.build, "examples", "zero-train")
    rows = []
    levers = [("none", False, False), ("checkpointing", True, False),
              ("checkpointing + offload", True, True)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("fp32", "bf16"):
            for name, ckpt, offload in levers:
                summary = os.path.join(tmp, "s.json")
                cmd = [train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                       "--set", f"trainer.model={args.model}",
                       "--set", f"trainer.steps={args.steps}",
                       "--set", f"trainer.seq_len={args.seq_len}",
                       "--set", f"train_micro_batch_size_per_gpu={args.micro_batch}",
                       "--set", "gradient_accumulation_steps=1",
                       "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}",
                       "--set", f"trainer.activation_checkpointing={'true' if ckpt else 'false'}",
                       "--set", f"activation_checkpointing.cpu_checkpointing={'true' if offload else 'false'}",
                       "--set", "steps_per_print=1000", "--summary-json", summary]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    sys.exit(f"bench: {' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
                s = json.load(open(summary))
                s["lever"], s["dtype"] = name, dtype
                rows.append(s)
                print(f"bench: {dtype} {name}: {s['step_seconds_median']:.3f} s/step, "
                      f"peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
    lines = [f"Model `{args.model}` ({rows[0]['num_params']:,} parameters), 1 rank, ZeRO-2, "
             f"micro-batch {args.micro_batch} x {args.seq_len} tokens, median of "
             f"{args.steps - 1} steps after the first, CPU (OMP_NUM_THREADS=1).", "",
             "| precision | levers | peak RSS (MiB) | vs none | step time (s) | vs none "
             "| offloaded to host (MiB) |", "|---|---|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        base = next(r for r in rows if r["dtype"] == dtype and r["lever"] == "none")
        for r in (r for r in rows if r["dtype"] == dtype):
            lines.append(
                f"| {dtype} | {r['lever']} | {r['peak_rss_bytes'] / 2**20:.0f} | "
                f"{r['peak_rss_bytes'] / base['peak_rss_bytes']:.2f}x | "
                f"{r['step_seconds_median']:.3f} | "
                f"{r['step_seconds_median'] / base['step_seconds_median']:.2f}x | "
                f"{r['offload_peak_host_bytes'] / 2**20:.1f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "memory_levers_cpu.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
