#!/usr/bin/env python3
"""Peak memory per phase of a run, read from the allocator, for one or more builds side by side.

Runs build/bench/phase-peaks (ranks as threads, every CPU storage counted by a wrapper around
c10's CPU allocator) for fp32/bf16, with and without optimizer offload and activation
checkpointing, and writes each phase's peak as a multiple of the steady model states (the
allocator's bytes in use after a steady step, less what the process held before) to
bench/results/phase_peaks_cpu.md. The bound each phase must meet: steady states + two buckets
per rank (+ the activations, in a step).

  python3 bench/phase_peaks.py --build before=/path/to/old/phase-peaks after=build/bench/phase-peaks
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["initialize", "first step", "second step", "steady step", "checkpoint save",
          "checkpoint load"]


def run(path, args, dtype, offload, ckpt):
    cmd = [path, "--model", args.model, "--ranks", str(args.ranks), "--dtype", dtype,
           "--offload", "1" if offload else "0", "--checkpointing", "1" if ckpt else "0",
           "--bucket", str(args.bucket), "--micro", str(args.micro), "--seq", str(args.seq)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"phase_peaks: {' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", nargs="+", default=[f"after={ROOT}/build/bench/phase-peaks"],
                    help="label=path/to/phase-peaks")
    ap.add_argument("--model", default="gpt-100m")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--bucket", type=int, default=500000, help="reduce_bucket_size (zero2.yaml's)")
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "phase_peaks_cpu.md"))
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    rows = []
    for dtype in ["fp32", "bf16"]:
        for offload in [False, True]:
            for ckpt in [False, True]:
                for label, path in builds:
                    r = run(path, args, dtype, offload, ckpt)
                    r["label"] = label
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    mib = 1 << 20
    lines = [
        f"# Peak memory per phase, {args.model}, {args.ranks} ranks (threads), stage 2, "
        f"micro-batch {args.micro} x {args.seq} tokens, reduce_bucket_size {args.bucket}",
        "",
        "From `python3 bench/phase_peaks.py` (bench/phase_peaks.cpp): the allocator's bytes in use "
        "(every CPU storage, counted), not RSS, net of the process before the model was "
        "initialized. Each phase's peak as a multiple of the steady model states (the bytes in "
        "use after a steady step: parameters, masters, optimizer states, gradient shard, bucket "
        "buffers); `before` is the engine that rebuilt its layout at the second step, `after` "
        "the one that only reorders its buckets.",
        "",
        "| dtype | offload | ckpt | build | steady states MiB | "
        + " | ".join(PHASES) + " |",
        "|---|---|---|---|---:|" + "---:|" * len(PHASES),
    ]
    for r in rows:
        s = r["steady_states"]
        cells = [f"{r['peaks'][p] / s:.2f}x" for p in PHASES]
        lines.append(f"| {r['dtype']} | {'yes' if r['offload'] else 'no'} | "
                     f"{'yes' if r['checkpointing'] else 'no'} | {r['label']} | {s / mib:.1f} | "
                     + " | ".join(cells) + " |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
