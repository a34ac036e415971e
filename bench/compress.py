#!/usr/bin/env python3
"""Compressed gradient reduction (zero_quantized_gradients, issue 25): bytes on the wire per step
and convergence of each gradient communication mode against uncompressed training.

1. Bytes: build/bench/compress-wire runs stage 2 on N thread ranks with a comm::CountingGroup
   around each rank's gloo group and prints, per mode (fp32, fp16 communication_data_type,
   int8, int4), the bytes one rank sends for the gradient reduction per step and the formula.
2. Convergence: the example GPT trained by zero-train under torchrun (N processes, the built-in
   corpus, configs/zero2.yaml) once per mode, with and without error feedback; the loss curve of
   each against uncompressed fp32 communication. The mean of the last 10 % of the steps is
   compared (a single step's loss is noisy: one micro-batch), next to the final step's loss.

  python3 bench/compress.py [--model small] [--ranks 2] [--steps 300] [--out bench/results]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, torchrun

MODES = [
    # name, --set overrides
    ("fp32 (uncompressed)", []),
    ("fp16 communication_data_type", ["communication_data_type=fp16"]),
    ("int8 + error feedback", ["zero_optimization.zero_quantized_gradients=true"]),
    ("int8, no error feedback", ["zero_optimization.zero_quantized_gradients=true",
                                 "zero_optimization.zero_quantized_gradients_error_feedback=false"]),
    ("int4 + error feedback", ["zero_optimization.zero_quantized_gradients=true",
                               "zero_optimization.zero_quantized_gradients_bits=4"]),
    ("int4, no error feedback", ["zero_optimization.zero_quantized_gradients=true",
                                 "zero_optimization.zero_quantized_gradients_bits=4",
                                 "zero_optimization.zero_quantized_gradients_error_feedback=false"]),
]


def losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "loss" in r:
                    out.append(r["loss"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    wire = subprocess.run([os.path.join(args.build, "bench", "compress-wire"), "--model", args.model,
                           "--ranks", str(args.ranks), "--steps", "2", "--block", str(args.block)],
                          capture_output=True, text=True, check=True)
    wire_rows = [json.loads(l) for l in wire.stdout.splitlines() if l.startswith("{")]

    train = os.path.join(args.build, "examples", "zero-train")
    rows = []
    port = 29850
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in ([] if args.skip_train else MODES):
            port += 1
            metrics = os.path.join(tmp, f"m{port}.jsonl")
            summary = os.path.join(tmp, f"s{port}.json")
            argv = [train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                    "--set", f"trainer.model={args.model}",
                    "--set", f"trainer.steps={args.steps}",
                    "--set", f"scheduler.params.total_num_steps={args.steps}",
                    "--set", f"trainer.seq_len={args.seq_len}",
                    "--set", f"trainer.metrics_file={metrics}",
                    "--set", f"train_micro_batch_size_per_gpu={args.micro}",
                    "--set", f"zero_optimization.zero_quantized_gradients_block={args.block}",
                    "--set", "steps_per_print=100000",
                    "--summary-json", summary]
            for s in sets:
                argv += ["--set", s]
            t0 = time.time()
            torchrun(args.ranks, port, argv)
            wall = time.time() - t0
            s = json.load(open(summary))
            ls = losses(metrics)
            tail = max(1, len(ls) // 10)
            rows.append({"mode": name, "final_loss": s["final_loss"], "first_loss": s["first_loss"],
                         "tail_mean": sum(ls[-tail:]) / tail, "tail_steps": tail,
                         "step_s": s["step_seconds_median"], "wall_s": wall,
                         "comm_exposed_s": s["comm_exposed_s_mean"], "curve": ls})
            print(f"{name}: final {s['final_loss']:.4f}, mean of last {tail} "
                  f"{rows[-1]['tail_mean']:.4f}, {wall:.0f} s", file=sys.stderr)

    path = os.path.join(args.out, f"compress_{args.model}_{args.ranks}ranks_cpu.md")
    with open(path, "w") as f:
        f.write(f"# Compressed gradient reduction: {args.model}, {args.ranks} ranks, CPU/gloo\n\n")
        f.write("Generated by `python3 bench/compress.py --model {} --ranks {} --steps {}`.\n\n"
                .format(args.model, args.ranks, args.steps))
        f.write("## Bytes on the wire per optimizer step (stage 2, one rank's gradient reduction)\n\n")
        f.write("Measured by `comm::CountingGroup` around each rank's gloo group "
                "(`build/bench/compress-wire`); the formula is in `bench/compress_wire.cpp`. "
                f"Block {args.block} elements per fp32 scale.\n\n")
        f.write("| mode | padded params | reductions / step | bytes sent / step | formula | "
                "bytes per param x (N-1)/N | vs fp32 |\n|---|---|---|---|---|---|---|\n")
        base = wire_rows[0]["sent_per_step"] if wire_rows else 1
        for w in wire_rows:
            f.write(f"| {w['mode']} | {w['padded_params']} | {w['reductions_per_step']:.0f} | "
                    f"{w['sent_per_step']} | {w['formula']} | {w['bytes_per_param']:.4f} | "
                    f"{w['sent_per_step'] / base:.3f} |\n")
        if rows:
            ref = rows[0]
            f.write(f"\n## Convergence ({args.steps} steps, micro-batch {args.micro} x seq "
                    f"{args.seq_len} per rank, configs/zero2.yaml, built-in corpus)\n\n")
            f.write("| mode | first loss | final loss | mean of last 10 % | vs uncompressed | "
                    "median step s | wall s |\n|---|---|---|---|---|---|---|\n")
            for r in rows:
                rel = (r["tail_mean"] - ref["tail_mean"]) / ref["tail_mean"] * 100
                f.write(f"| {r['mode']} | {r['first_loss']:.4f} | {r['final_loss']:.4f} | "
                        f"{r['tail_mean']:.4f} | {rel:+.2f} % | {r['step_s']:.3f} | "
                        f"{r['wall_s']:.0f} |\n")
            f.write("\nLoss curve (mean over windows of 10 % of the steps):\n\n")
            win = max(1, args.steps // 10)
            f.write("| steps | " + " | ".join(r["mode"] for r in rows) + " |\n")
            f.write("|---" * (len(rows) + 1) + "|\n")
            for a in range(0, args.steps, win):
                cells = []
                for r in rows:
                    part = r["curve"][a:a + win]
                    cells.append(f"{sum(part) / len(part):.4f}" if part else "")
                f.write(f"| {a + 1}-{min(a + win, args.steps)} | " + " | ".join(cells) + " |\n")
    print(path)


if __name__ == "__main__":
    main()
