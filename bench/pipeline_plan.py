#!/usr/bin/env python3
"""The planner's pipeline step time (zero-memory --pp P --schedule ...) against zero-train's
measured one on this machine, P = 1, 2, 4 pipeline stages (D = T = 1) and m micro-batches.

1. Calibrate as bench/time_model.py does for CPU runs (its functions, not a copy): with P
   processes running at once, one thread each as torchrun gives the ranks, the FLOP rate of the
   model's own matmul shapes and a large copy's bandwidth; for P > 1 gloo's all-gather bus
   bandwidth and per-call latency from build/bench/comm-bench on P ranks, which zero-memory uses
   for the stage-boundary sends (bytes moved once, as an all-gather moves them). Nothing is
   fitted to the pipeline runs.
2. Predict: build/tools/zero-memory --pp P --grad-accum m --schedule S --json with those rates
   (efficiency 1: the rate is the measured one), ZeRO stage 1, fp32.
3. Measure: build/examples/zero-train through torchrun with pipeline.stages = P, the same shape,
   trainer.metrics_file's step_s, the median of the steps after the first.
Every repetition calibrates and then runs every configuration once (other jobs share the
machine: a prediction and its measurement should see the same load); the table has the medians
over repetitions of the predictions, the measurements and the per-repetition ratios.

  python3 bench/pipeline_plan.py [--model gpt-25m] [--stages 1 2 4] [--micro-batches 4 8]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, torchrun
from time_model import calibrate_comm, concurrent_rate, matmul_shapes

# The planner's two ways of cutting the stages (zero-memory --partition): equal compute per
# stage, and the runtime's cut by parameter count (zero-train's pipeline.partition default).
PARTITIONS = ["equal", "parameters"]


def predict(build, args, p, m, rates, partition):
    argv = [os.path.join(build, "tools", "zero-memory"), "--model", args.model, "--gpus", str(p),
            "--pp", str(p), "--schedule", args.schedule, "--grad-accum", str(m),
            "--partition", partition,
            "--micro-batch", str(args.micro_batch), "--seq-len", str(args.seq_len),
            "--dtype", "fp32", "--device-memory", "1TB", "--json",
            "--peak-tflops", str(rates["flops"] / 1e12), "--efficiency", "1",
            "--memory-bw", str(rates["memory_bw"] / 1e9)]
    if p > 1:
        argv += ["--all-gather-bw", str(rates["all_gather_bw"] / 1e9),
                 "--latency-us", str(rates["latency_s"] * 1e6)]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return out["stages"][1]["time"]  # ZeRO stage 1 (the most a pipeline runs)


def measure(build, args, p, m, port, tmp):
    metrics = os.path.join(tmp, f"metrics_{p}_{m}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    argv = [os.path.join(build, "examples", "zero-train"),
            "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
            "--set", "zero_optimization.stage=1", "--set", f"trainer.model={args.model}",
            "--set", f"trainer.steps={args.steps}", "--set", f"trainer.seq_len={args.seq_len}",
            "--set", f"train_micro_batch_size_per_gpu={args.micro_batch}",
            "--set", f"gradient_accumulation_steps={m}", "--set", "steps_per_print=1000",
            "--set", f"pipeline.schedule={args.schedule}",
            "--set", f"trainer.metrics_file={metrics}"]
    if p > 1:
        argv += ["--set", f"pipeline.stages={p}"]
    torchrun(p, port, argv)
    steps = [json.loads(line)["step_s"] for line in open(metrics) if line.strip()]
    return statistics.median(steps[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m")
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--budget-min", type=float, default=14,
                    help="skip a further repetition that would end after this many minutes")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    # One thread per rank, P = 1 included (torchrun sets it only for several ranks), as the
    # calibration's probes run.
    os.environ["OMP_NUM_THREADS"] = "1"
    started = time.time()
    port = 29950
    tokens = args.micro_batch * args.seq_len

    # Each repetition calibrates and then measures every configuration, so that a prediction
    # and its measurement see the same load on the shared machine; the ratio is taken per
    # repetition and its median reported.
    configs = [(p, m) for p in args.stages for m in args.micro_batches]
    reps = []  # per repetition: {"rates": {P: ...}, "pred": {(P, m, part): ...}, "meas": ...}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            rep_start = time.time()
            rates, preds, meas, load = {}, {}, {}, {}
            for p in args.stages:
                r = {"flops": concurrent_rate(p, "flops", tokens, matmul_shapes(args.model)),
                     "memory_bw": concurrent_rate(p, "copy", 0, [])}
                if p > 1:
                    port += 2
                    r.update(calibrate_comm(p, port, args.build))
                rates[p] = r
                for m in args.micro_batches:
                    for part in PARTITIONS:
                        preds[(p, m, part)] = predict(args.build, args, p, m, r, part)
                print(f"bench: rep {rep} calibrated P={p}: {r['flops'] / 1e9:.2f} GFLOP/s, "
                      f"{r['memory_bw'] / 1e9:.2f} GB/s copy"
                      + (f", all-gather {r['all_gather_bw'] / 1e9:.2f} GB/s, latency "
                         f"{r['latency_s'] * 1e6:.0f} us" if p > 1 else ""), file=sys.stderr)
            for (p, m) in configs:
                port += 1
                meas[(p, m)] = measure(args.build, args, p, m, port, tmp)
                load[(p, m)] = os.getloadavg()[0]
                print(f"bench: rep {rep} P={p} m={m}: {meas[(p, m)]:.3f} s/step (predicted "
                      f"{preds[(p, m, 'equal')]['step_s']:.3f} equal, "
                      f"{preds[(p, m, 'parameters')]['step_s']:.3f} by parameters; load "
                      f"{load[(p, m)]:.1f})", file=sys.stderr)
            reps.append({"rates": rates, "pred": preds, "meas": meas, "load": load})
            took = time.time() - rep_start
            if rep + 1 < args.reps and time.time() + took - started > 60 * args.budget_min:
                print(f"bench: stopping after {rep + 1} repetitions (time budget)", file=sys.stderr)
                break

    # The raw figures first: a table that fails to print loses no measurement.
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "pipeline_plan_vs_measured")
    with open(stem + ".json", "w") as f:
        json.dump({"args": vars(args), "reps": [
            {"rates": {str(p): v for p, v in r["rates"].items()},
             "load": {f"{p},{m}": v for (p, m), v in r["load"].items()},
             "measured_step_s": {f"{p},{m}": v for (p, m), v in r["meas"].items()},
             "predicted": {f"{p},{m},{part}": v for (p, m, part), v in r["pred"].items()}}
            for r in reps]}, f, indent=1)

    def med(values):
        return statistics.median(list(values))

    reps_done = len(reps)
    loads = [x for r in reps for x in r["load"].values()]
    lines = [
        f"Predicted (zero-memory --pp P --schedule {args.schedule}, rates calibrated on this "
        f"machine as bench/time_model.py calibrates them, in each repetition right before its "
        f"runs) vs measured (zero-train) step time: {args.model}, fp32, AdamW, ZeRO stage 1, "
        f"D = T = 1, micro-batch {args.micro_batch} x {args.seq_len} tokens, m micro-batches "
        f"per step, one thread per rank; a run's figure is the median of its {args.steps - 1} "
        f"steps after the first; {reps_done} repetitions, the medians over them. The ranks share "
        f"2 CPU cores with each other and with other jobs (1-minute load average "
        f"{min(loads):.1f} to {max(loads):.1f} during the runs), so both the calibration and the "
        f"runs are noisy. Wall time of the benchmark: {(time.time() - started) / 60:.1f} min.",
        "",
        "Predicted two ways: stages of equal compute (zero-memory's default, `--partition "
        "equal`), and cut as the runtime cuts them (`--partition parameters`: "
        "[embedding, blocks, head] balanced by parameter count, each stage timed by its own "
        "layers, the schedule simulated). m/p: measured / predicted, per repetition; / P=1: "
        "that ratio over the P = 1 run's of the same repetition and m, the error the pipeline "
        "adds to the single-stage model's.",
        "",
        "| P | m | stage compute by parameters (s) | bubble, equal / by parameters "
        "| predicted step, equal (s) | predicted step, by parameters (s) | measured step (s) "
        "| m/p equal | m/p by parameters | / P=1, equal | / P=1, by parameters |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (p, m) in configs:
        # P = 1 has no bubble (zero-memory's single-stage JSON has no such term).
        te = {k: med(r["pred"][(p, m, "equal")].get(k, 0.0) for r in reps)
              for k in ("step_s", "bubble_fraction")}
        tp = {k: med(r["pred"][(p, m, "parameters")].get(k, 0.0) for r in reps)
              for k in ("step_s", "bubble_fraction")}
        comp = [r["pred"][(p, m, "parameters")].get("stage_compute_s") for r in reps]
        if comp[0]:
            stages = " / ".join(f"{med(c[i] for c in comp):.3f}" for i in range(len(comp[0])))
        else:
            t0 = [r["pred"][(p, m, "parameters")] for r in reps]
            stages = f"{med(t['forward_s'] + t['backward_s'] + t['recompute_s'] for t in t0):.3f}"
        ratio = {part: [r["meas"][(p, m)] / r["pred"][(p, m, part)]["step_s"] for r in reps]
                 for part in PARTITIONS}
        norm = "- | -"
        if (1, m) in reps[0]["meas"]:
            base = {part: [r["meas"][(1, m)] / r["pred"][(1, m, part)]["step_s"] for r in reps]
                    for part in PARTITIONS}
            norm = " | ".join(f"{med(x / y for x, y in zip(ratio[part], base[part])):.2f}"
                              for part in PARTITIONS)
        meas = med(r["meas"][(p, m)] for r in reps)
        lines.append(f"| {p} | {m} | {stages} | {100 * te['bubble_fraction']:.1f}% / "
                     f"{100 * tp['bubble_fraction']:.1f}% | {te['step_s']:.3f} | "
                     f"{tp['step_s']:.3f} | {meas:.3f} | {med(ratio['equal']):.2f} | "
                     f"{med(ratio['parameters']):.2f} | {norm} |")
    lines += ["", "Calibrated rates (per rank, with P ranks running; median over the "
              "repetitions, range in brackets):", "",
              "| P | matmul GFLOP/s | copy GB/s | all-gather GB/s | latency (us) |",
              "|---|---|---|---|---|"]

    def cell(p, key, scale, fmt):
        xs = [r["rates"][p][key] * scale for r in reps]
        return f"{med(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"
    for p in args.stages:
        lines.append(f"| {p} | {cell(p, 'flops', 1e-9, '.1f')} | "
                     f"{cell(p, 'memory_bw', 1e-9, '.1f')} | "
                     + (f"{cell(p, 'all_gather_bw', 1e-9, '.2f')} | "
                        f"{cell(p, 'latency_s', 1e6, '.0f')} |" if p > 1 else "- | - |"))
    table = "\n".join(lines) + "\n"
    with open(stem + ".md", "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
