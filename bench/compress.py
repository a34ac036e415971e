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
      [--modes fp32,int8,int8-noef] [--data bin:/tmp/pystd_256.bin --data-name pystd]

--data: any trainer.data source (bench/make_token_file.py makes a token file of real text);
--data-name tags the result file (compress_<model>_<ranks>ranks_<name>_cpu.md). The first mode
is the reference the others are compared with. A JSON file of the rows is written beside it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, torchrun


def torchrun_nodes(nodes, ranks, port, argv):
    """`nodes` torchrun agents on this machine, ranks / nodes processes each, as on `nodes` hosts."""
    per = ranks // nodes
    procs = [subprocess.Popen(["torchrun", "--no-python", f"--nnodes={nodes}", f"--node-rank={k}",
                               f"--nproc-per-node={per}", "--master-addr=127.0.0.1",
                               f"--master-port={port}"] + argv,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(nodes)]
    outs = [p.communicate() for p in procs]
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"bench: node run failed:\n{o[-3000:]}\n{e[-3000:]}")

MODES = [
    # short name (--modes), name, --set overrides
    ("fp32", "fp32 (uncompressed)", []),
    ("fp16", "fp16 communication_data_type", ["communication_data_type=fp16"]),
    ("int8", "int8 + error feedback", ["zero_optimization.zero_quantized_gradients=true"]),
    ("int8-noef", "int8, no error feedback",
     ["zero_optimization.zero_quantized_gradients=true",
      "zero_optimization.zero_quantized_gradients_error_feedback=false"]),
    ("int8-flat", "int8 + error feedback, flat exchange",
     ["zero_optimization.zero_quantized_gradients=true",
      "zero_optimization.zero_quantized_gradients_hierarchical=false"]),
    ("int4", "int4 + error feedback", ["zero_optimization.zero_quantized_gradients=true",
                                       "zero_optimization.zero_quantized_gradients_bits=4"]),
    ("int4-noef", "int4, no error feedback",
     ["zero_optimization.zero_quantized_gradients=true",
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
    ap.add_argument("--modes", default=",".join(m[0] for m in MODES))
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--data-name", default="")
    ap.add_argument("--train", default="", help="zero-train binary (default: BUILD/examples)")
    ap.add_argument("--port", type=int, default=29850)
    ap.add_argument("--nodes", type=int, default=1,
                    help="split --ranks over this many torchrun 'nodes' on this machine "
                         "(LOCAL_WORLD_SIZE = ranks / nodes: the hierarchical exchange)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    wire = subprocess.run([os.path.join(args.build, "bench", "compress-wire"), "--model", args.model,
                           "--ranks", str(args.ranks), "--steps", "2", "--block", str(args.block),
                           "--nodes", str(args.nodes)],
                          capture_output=True, text=True, check=True)
    lines = [json.loads(l) for l in wire.stdout.splitlines() if l.startswith("{")]
    wire_rows = [w for w in lines if "padded_params" in w]
    node_rows = [w for w in lines if "within_per_step" in w]

    train = args.train or os.path.join(args.build, "examples", "zero-train")
    by_name = {m[0]: m for m in MODES}
    unknown = [m for m in args.modes.split(",") if m not in by_name]
    if unknown:
        sys.exit(f"bench: unknown mode(s) {unknown}; known: {list(by_name)}")
    modes = [by_name[m][1:] for m in args.modes.split(",")]
    rows = []
    port = args.port
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in ([] if args.skip_train else modes):
            port += 1
            metrics = os.path.join(tmp, f"m{port}.jsonl")
            summary = os.path.join(tmp, f"s{port}.json")
            argv = [train, "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                    "--set", f"trainer.model={args.model}",
                    "--set", f"trainer.steps={args.steps}",
                    "--set", f"scheduler.params.total_num_steps={args.steps}",
                    "--set", f"trainer.seq_len={args.seq_len}",
                    "--set", f"trainer.data={args.data}",
                    "--set", f"trainer.metrics_file={metrics}",
                    "--set", f"train_micro_batch_size_per_gpu={args.micro}",
                    "--set", f"zero_optimization.zero_quantized_gradients_block={args.block}",
                    "--set", "steps_per_print=100000",
                    "--summary-json", summary]
            for s in sets:
                argv += ["--set", s]
            t0 = time.time()
            if args.nodes > 1:
                torchrun_nodes(args.nodes, args.ranks, port, argv)
            else:
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

    tag = f"_{args.data_name}" if args.data_name else ""
    if args.nodes > 1:
        tag += f"_{args.nodes}nodes"
    path = os.path.join(args.out, f"compress_{args.model}_{args.ranks}ranks{tag}_cpu.md")
    with open(path[:-3] + ".json", "w") as f:
        json.dump({"model": args.model, "ranks": args.ranks, "steps": args.steps,
                   "data": args.data, "rows": rows}, f)
    with open(path, "w") as f:
        f.write(f"# Compressed gradient reduction: {args.model}, {args.ranks} ranks, CPU/gloo\n\n")
        f.write("Generated by `python3 bench/compress.py --model {} --ranks {} --steps {} "
                "--modes {}{}{}`.\n\n".format(args.model, args.ranks, args.steps, args.modes,
                                             f" --data {args.data}" if args.data_name else "",
                                             f" --nodes {args.nodes}" if args.nodes > 1 else ""))
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
        if node_rows:
            f.write(f"\nThe ranks as {args.nodes} nodes of {args.ranks // args.nodes} "
                    "(LOCAL_WORLD_SIZE): the quantized modes go hierarchical; bytes one rank "
                    "sends per step within its node and across nodes, counted on the two "
                    "subgroups, against the formula and the flat exchange's bytes across "
                    "nodes:\n\n")
            f.write("| mode | within node | formula | across nodes | formula | flat across nodes "
                    "|\n|---|---|---|---|---|---|\n")
            for w in node_rows:
                f.write(f"| {w['mode']} | {w['within_per_step']} | {w['within_formula']} | "
                        f"{w['across_per_step']} | {w['across_formula']} | "
                        f"{w['flat_across_formula']} |\n")
        if rows:
            ref = rows[0]
            f.write(f"\n## Convergence ({args.steps} steps, micro-batch {args.micro} x seq "
                    f"{args.seq_len} per rank, configs/zero2.yaml, data {args.data})\n\n")
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
