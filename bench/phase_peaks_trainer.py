#!/usr/bin/env python3
"""Peak memory per phase of zero-train itself (torchrun, one process per rank), from the allocator.

On CPU zero-train counts every CPU storage (zero/host_counting.hpp) and its summary JSON gives,
per phase (initialize, forward, backward, step, save) and per training step, the most any rank's
allocator held, the bytes in use after the last step (the steady model states) and the bound every
phase must meet: steady states + two buckets + the planner's activations. This runs the 8
configurations (fp32/bf16 x optimizer offload x activation checkpointing) one after another and
writes the table.

  python3 bench/phase_peaks_trainer.py [--model gpt-100m --ranks 4 --steps 3]
    [--train build/examples/zero-train] [--label after] [--out bench/results/...md]

Several --train label=path pairs put builds side by side (before/after).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["initialize", "forward", "backward", "step", "save"]


def run(train, args, dtype, offload, ckpt, work, port):
    summary = os.path.join(work, f"{dtype}_{int(offload)}_{int(ckpt)}.json")
    cmd = ["nice", "-n", "10", "torchrun", "--no-python", "--standalone",
           "--nproc-per-node", str(args.ranks), "--master-port", str(port), train,
           "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
           "--set", f"trainer.model={args.model}", "--set", f"trainer.steps={args.steps}",
           "--set", f"trainer.seq_len={args.seq_len}",
           "--set", f"train_micro_batch_size_per_gpu={args.micro}",
           "--set", "gradient_accumulation_steps=1", "--set", "steps_per_print=1000",
           "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}",
           "--set", f"trainer.activation_checkpointing={'true' if ckpt else 'false'}",
           "--set", f"zero_optimization.offload_optimizer.device={'cpu' if offload else 'none'}",
           "--set", f"trainer.save_dir={os.path.join(work, 'ck')}",
           "--set", f"trainer.save_interval={args.steps - 1}", "--set", "trainer.keep_last=1",
           "--summary-json", summary]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"phase_peaks_trainer: {' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n"
                 f"{res.stderr[-3000:]}")
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", nargs="+",
                    default=[f"after={ROOT}/build/examples/zero-train"], help="label=path")
    ap.add_argument("--model", default="gpt-100m")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--only", default="", help="dtype,offload,ckpt (e.g. bf16,1,0): one row")
    ap.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", "phase_peaks_gpt100m_4ranks_cpu.md"))
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.train]
    rows = []
    port = 29600
    for dtype in ["fp32", "bf16"]:
        for offload in [False, True]:
            for ckpt in [False, True]:
                if args.only and args.only != f"{dtype},{int(offload)},{int(ckpt)}":
                    continue
                for label, path in builds:
                    with tempfile.TemporaryDirectory(prefix="zero_phase_peaks_") as work:
                        s = run(path, args, dtype, offload, ckpt, work, port)
                    port += 1
                    r = {"label": label, "dtype": dtype, "offload": offload, "ckpt": ckpt,
                         "peaks": {p: s["phase_peaks"][p]["measured"] for p in PHASES},
                         "predicted": {p: s["phase_peaks"][p]["predicted"] for p in PHASES},
                         "steps": s["phase_step_peaks"], "steady": s["steady_states_bytes"],
                         "bound": s["phase_bound_bytes"],
                         "peak_rss": s.get("peak_rss_bytes")}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    mib = 1 << 20
    lines = [
        f"# Peak memory per phase of zero-train, {args.model}, {args.ranks} ranks (torchrun, one "
        f"process each), CPU, stage 2, micro-batch {args.micro} x {args.seq_len} tokens, "
        f"{args.steps} steps, a checkpoint saved after step {args.steps - 1}",
        "",
        "From `python3 bench/phase_peaks_trainer.py`: the summary JSON's `phase_peaks`, "
        "`phase_step_peaks`, `steady_states_bytes` and `phase_bound_bytes`, read from the host's "
        "counting allocator (every CPU storage; zero/host_counting.hpp), not RSS; max over "
        "ranks. `steady`: the bytes in use after the last step; `bound`: steady + two buckets "
        "+ the planner's activations at backward's worst moment, a bucket being "
        "reduce_bucket_size (5e5) plus the largest parameter (the one that closes it; "
        "gpt-100m's embedding and head, 20.5 M elements each), in fp32. Each phase as a multiple of the bound; above "
        "1.00x breaks it.",
        "",
        "| dtype | offload | ckpt | build | steady MiB | bound MiB | "
        + " | ".join(PHASES) + " | steps 1, 2, 3 | within |",
        "|---|---|---|---|---:|---:|" + "---:|" * len(PHASES) + "---|---|",
    ]
    for r in rows:
        b = r["bound"]
        cells = [f"{r['peaks'][p] / b:.2f}x" for p in PHASES]
        steps = ", ".join(f"{v / b:.2f}x" for v in r["steps"])
        ok = all(r["peaks"][p] <= b for p in PHASES)
        lines.append(f"| {r['dtype']} | {'yes' if r['offload'] else 'no'} | "
                     f"{'yes' if r['ckpt'] else 'no'} | {r['label']} | {r['steady'] / mib:.1f} | "
                     f"{b / mib:.1f} | " + " | ".join(cells) + f" | {steps} | "
                     f"{'yes' if ok else '**no**'} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
