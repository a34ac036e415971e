#!/usr/bin/env python3
"""ZeRO stages side by side: step time and per-rank memory of stages 0, 1 and 2 at N ranks.

Every configuration runs in this one invocation on the same machine, so the ratios hold even
where absolute times do not (a 2-core CI box runs 4 ranks on 2 cores). Alongside, comm-bench
times reduce-scatter against all-reduce: gloo emulates reduce-scatter as all-reduce + slice,
so on CPU stage 2's gradient traffic is not the half that NCCL gives.

  python3 bench/stages.py [--model gpt-100m] [--ranks 2 4] [--steps 4] [--out bench/results]
"""
import argparse
import json
import os
import sys
import tempfile

from benchlib import ROOT, mib, torchrun


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-100m")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train = os.path.join(args.build, "examples", "zero-train")
    comm = os.path.join(args.build, "bench", "comm-bench")
    port = 29700
    rows, comm_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            port += 1
            comm_rows.append(json.loads(torchrun(n, port, [comm, str(1 << 23)]).splitlines()[-1]))
            # Stage 2 once more with reduce_scatter: false (all-reduce, keep the own shard):
            # DeepSpeed's switch, and the faster one on gloo (see the collectives table).
            variants = [(d, st, True) for d in args.dtypes for st in (0, 1, 2)]
            variants += [(d, 2, False) for d in args.dtypes]
            for dtype, stage, rs in variants:
                port += 1
                summary = os.path.join(tmp, f"n{n}s{stage}{dtype}{rs}.json")
                torchrun(n, port, [
                    train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                    "--set", f"zero_optimization.stage={stage}",
                    "--set", f"zero_optimization.reduce_scatter={'true' if rs else 'false'}",
                    "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}",
                    "--set", f"trainer.model={args.model}",
                    "--set", f"trainer.steps={args.steps}",
                    "--set", f"trainer.seq_len={args.seq_len}",
                    "--set", "train_micro_batch_size_per_gpu=1",
                    "--set", "gradient_accumulation_steps=1",
                    "--set", "steps_per_print=1000",
                    "--summary-json", summary])
                s = json.load(open(summary))
                s["dtype"], s["reduce_scatter"] = dtype, rs
                rows.append(s)
                print(f"bench: N={n} {dtype} stage {stage} rs={rs}: "
                      f"{s['step_seconds_median']:.3f} s/step", file=sys.stderr)

    lines = [f"Model `{args.model}` ({rows[0]['num_params']:,} parameters), AdamW, micro-batch 1 "
             f"x {args.seq_len} tokens per rank, median of {args.steps - 1} steps after the "
             "first; per-rank memory is what the engine accounts (rank 0), next to the ZeRO "
             "formula. Ranks share 2 CPU cores: compare times within a row group only.", "",
             "| N | dtype | stage | step time (s) | vs stage 0 | params | grads | master "
             "| optimizer | comm buffers | total (MiB) | predicted (MiB) | vs stage 0 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in args.ranks:
        for dtype in args.dtypes:
            group = [r for r in rows if r["world_size"] == n and r["dtype"] == dtype]
            base = next(r for r in group if r["stage"] == 0)
            bm = base["memory"][0]["measured"]
            for r in group:
                m, p = r["memory"][0]["measured"], r["memory"][0]["predicted"]
                label = str(r["stage"]) + ("" if r["reduce_scatter"] else " (all-reduce)")
                lines.append(
                    f"| {n} | {dtype} | {label} | {r['step_seconds_median']:.3f} | "
                    f"{r['step_seconds_median'] / base['step_seconds_median']:.2f}x | "
                    f"{mib(m['params']):.0f} | {mib(m['grads']):.0f} | {mib(m['master']):.0f} | "
                    f"{mib(m['optimizer']):.0f} | {mib(m['comm_buffers']):.0f} | "
                    f"{mib(m['total']):.0f} | {mib(p['total']):.0f} | "
                    f"{m['total'] / bm['total']:.2f}x |")
    lines += ["", "Gloo collectives on the same machine (fp32 payload, median of 5):", "",
              "| N | payload (MB) | all-reduce (s) | reduce-scatter (s) | all-gather (s) "
              "| reduce-scatter / all-reduce (NCCL model: 0.5) |", "|---|---|---|---|---|---|"]
    for c in comm_rows:
        lines.append(f"| {c['world_size']} | {c['payload_mb']:.0f} | {c['all_reduce_s']:.4f} | "
                     f"{c['reduce_scatter_s']:.4f} | {c['all_gather_s']:.4f} | "
                     f"{c['reduce_scatter_over_all_reduce']:.2f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "stages_cpu.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "stages_cpu.json"), "w") as f:
        json.dump({"runs": rows, "comm": comm_rows}, f, indent=1)
    print(table)


if __name__ == "__main__":
    main()
