#!/usr/bin/env python3
"""zero next to its peers on the CPU: the same LLaMA-style GPT trained by zero-train (stages 0, 1,
2), PyTorch DDP, DDP + ZeroRedundancyOptimizer, FSDP2 (fully_shard, reshard_after_forward=False)
and DeepSpeed ZeRO-1/2 (.dsvenv, DS_ACCELERATOR=cpu, torch_adam), over gloo at N ranks, fp32 and
bf16, repetitions interleaved (every configuration once, then again) so machine load spreads
over all of them.

Per run: step time (median of the steps after the warm-up ones, rank 0), peak RSS per rank (GNU
time's maximum resident set, the max over ranks) minus that framework's process baseline (a
process that imports the framework and sets up the gloo process group, but builds no model:
comm-bench with a 1-element payload for zero, the same worker with --baseline for the Python
ones), and model-state bytes: zero's engine accounting for zero-train, the live tensor storages
(parameters, gradients, masters, optimizer states, flat buffers; each storage once) found by a
gc walk after the last step for the Python frameworks.

  python3 bench/peers.py [--quick] [--ranks 2 4] [--dtypes fp32 bf16] [--reps 2]
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, mib  # noqa: E402

FRAMEWORKS = ["zero-s0", "zero-s1", "zero-s2", "ddp", "ddp-zero1", "fsdp2", "ds-z1", "ds-z2"]
# Stage 3 (not in the default set; --stage3 runs them): zero-s3 (zero-train at stage 3, each
# block a unit; DeepSpeed's prefetch and reuse defaults), zero-s3-fsdp (the same with FSDP2's
# schedule: one unit of prefetch, each unit released after its forward: ZERO_SETS),
# FSDP2 resharding after forward (fully_shard's default, the ZeRO-3 schedule) and DeepSpeed
# ZeRO-3. `ref` is the single-process reference of --check-params (one process, the N ranks'
# batches concatenated), not a table row.
STAGE3 = ["zero-s3", "zero-s3-fsdp", "fsdp2-z3", "ds-z3"]
ZERO_SETS = {"zero-s3-fsdp": ["zero_optimization.stage3_max_reuse_distance=0",
                              "zero_optimization.stage3_prefetch_bucket_size=1"]}
BASELINE_OF = {"zero-s0": "zero", "zero-s1": "zero", "zero-s2": "zero", "zero-s3": "zero",
               "zero-s3-fsdp": "zero",
               "ddp": "torch", "ddp-zero1": "torch", "fsdp2": "torch", "fsdp2-z3": "torch",
               "ds-z1": "deepspeed", "ds-z2": "deepspeed", "ds-z3": "deepspeed", "ref": "torch"}
PHASES = ["forward", "backward", "step"]
# Optimizer and clipping of configs/zero2.yaml, for every framework.
LR, BETAS, WD, CLIP = 3e-3, (0.9, 0.95), 0.1, 1.0
PRESETS = {"gpt-25m": dict(vocab=8192, dim=384, layers=12, heads=6, max_seq=512, tied=True),
           "gpt-100m": dict(vocab=32000, dim=640, layers=12, heads=10, max_seq=1024, tied=False),
           "small": dict(vocab=256, dim=192, layers=6, heads=6, max_seq=256, tied=True)}


# ---------------------------------------------------------------------------------------------
# The worker: one rank of a Python framework (run under torchrun).

def live_tensor_bytes(torch):
    """Bytes of every live tensor storage reachable from Python, each storage once."""
    gc.collect()
    seen = {}
    for o in gc.get_objects():
        try:
            if not isinstance(o, torch.Tensor):
                continue
            s = o.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        except Exception:  # DTensor wrappers have no storage of their own; their locals count
            continue
    return sum(seen.values())


def phase_peaks(prof, step_tag):
    """Per phase of the profiled step `step_tag`, the most bytes the CPU allocator held above what
    it held when that step began: a running sum over the profiler's [memory] events (every
    allocation and free of c10's CPU allocator on the profiled threads, in time order)."""
    ev = list(prof.profiler.kineto_results.events())
    spans = {e.name()[len(step_tag) + 1:]: (e.start_ns(), e.start_ns() + e.duration_ns())
             for e in ev if e.name().startswith(step_tag + ":")}
    mem = sorted((e.start_ns(), e.nbytes()) for e in ev if e.name() == "[memory]")
    t0 = spans[PHASES[0]][0]
    running, at_start = 0, None
    peaks = {ph: None for ph in PHASES}
    for t, nb in mem:
        if at_start is None and t >= t0:
            at_start = running
        running += nb
        for ph, (a, b) in spans.items():
            if a <= t <= b:
                peaks[ph] = max(peaks[ph] if peaks[ph] is not None else running, running)
    if at_start is None:
        at_start = running
    return {ph: (v - at_start if v is not None else 0) for ph, v in peaks.items()}


def full_params(torch, model, fw, engine=None):
    """Every parameter whole, in named_parameters() order, as one fp32 vector (collective: every
    rank calls it)."""
    named = list((engine.module if engine is not None else model).named_parameters())
    if fw == "ds-z3":
        import deepspeed
        with deepspeed.zero.GatheredParameters([q for _, q in named]):
            return torch.cat([q.detach().float().reshape(-1).clone() for _, q in named])
    out = []
    for _, q in named:
        t = q.detach()
        if hasattr(t, "full_tensor"):  # FSDP2's DTensor shards
            t = t.full_tensor()
        out.append(t.float().reshape(-1))
    return torch.cat(out)


def torch_adamw_phases(model):
    """(model, backward, step) with torch's AdamW over the model's own parameters, clipped."""
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WD)

    def opt_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (model, lambda loss: loss.backward(), opt_step)


def worker(a):
    import torch
    import torch.distributed as dist
    if a.framework.startswith("ds") or a.baseline == "deepspeed":
        import deepspeed
        import deepspeed.comm.torch  # noqa: F401
        # The CPU accelerator JIT-compiles a shared-memory all-reduce otherwise; gloo does it.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
        from torch.distributed.fsdp import fully_shard  # noqa: F401 (part of the baseline)
    dist.barrier()
    if a.baseline:
        return
    torch.set_num_threads(1)
    from torch_eager_gpt import Gpt
    rank, world = dist.get_rank(), dist.get_world_size()
    p = PRESETS[a.model]
    torch.manual_seed(0)
    model = Gpt(p["vocab"], p["dim"], p["layers"], p["heads"], p["max_seq"], False, tied=p["tied"])
    bf16 = a.dtype == "bf16"
    fw = a.framework
    masters = None
    engine = None
    # Each framework's step as its three phases: forward (returns the loss), backward, step.
    if fw.startswith("ds"):
        stage = int(fw[-1])
        zo = {"stage": stage, "reduce_bucket_size": int(5e5)}
        cfg = {"train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": 1,
               "zero_optimization": zo,
               "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS),
                                                         "weight_decay": WD, "torch_adam": True}},
               "gradient_clipping": CLIP, "bf16": {"enabled": bf16}, "steps_per_print": 10**9}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=cfg)
        phases = (lambda x, y: engine(x, y), engine.backward, engine.step)
    elif fw in ("fsdp2", "fsdp2-z3"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
            if bf16 else MixedPrecisionPolicy()
        # fsdp2 keeps the gathered parameters from forward to backward (ZeRO-2-like traffic);
        # fsdp2-z3 frees them after each block's forward and gathers again in backward.
        reshard = fw == "fsdp2-z3"
        for b in model.blocks:
            fully_shard(b, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, reshard_after_forward=reshard, mp_policy=mp)
        phases = torch_adamw_phases(model)
    elif fw == "ref":
        phases = torch_adamw_phases(model)
    else:
        # DDP: bf16 runs keep the model in bf16 (gradients all-reduced in bf16) and fp32 master
        # copies for the optimizer, as zero does.
        if bf16:
            masters = [q.detach().clone().float() for q in model.parameters()]
            model.to(torch.bfloat16)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=2)
        params = masters if bf16 else list(model.parameters())
        if fw == "ddp-zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=LR,
                                          betas=BETAS, weight_decay=WD)
        else:
            opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WD)

        def opt_step():
            if bf16:
                for m, q in zip(masters, model.parameters()):
                    m.grad = q.grad.float()
                    q.grad = None
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if bf16:
                with torch.no_grad():
                    for m, q in zip(masters, model.parameters()):
                        q.copy_(m)
        phases = (ddp, lambda loss: loss.backward(), opt_step)

    # The reference takes every rank's batch (the same generators) side by side: with equal
    # token counts the mean over their union is the mean of the ranks' means.
    gens = [torch.Generator().manual_seed(1000 + r)
            for r in (range(a.ref_world) if fw == "ref" else [rank])]
    # --phases: the last two steps run under the profiler (allocator events) and are not timed;
    # the second of them is the one measured (the first makes every free in it a known block).
    profiled = 2 if a.phases else 0
    times, base, prof = [], 0, None
    for s in range(a.steps):
        x = torch.cat([torch.randint(p["vocab"], (a.micro, a.seq_len), generator=g)
                       for g in gens])
        y = torch.roll(x, -1, 1)
        if s == a.steps - profiled:
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            prof.__enter__()
        if profiled and s == a.steps - 1:
            base = live_tensor_bytes(torch)  # what the step starts from
        t = time.perf_counter()
        if prof is not None:
            from torch.profiler import record_function
            for ph, f in zip(PHASES, phases):
                with record_function(f"s{s}:{ph}"):
                    out = f(x, y) if ph == "forward" else (f(out) if ph == "backward" else f())
        else:
            phases[1](phases[0](x, y))
            phases[2]()
            times.append(time.perf_counter() - t)
    peaks = {}
    if prof is not None:
        prof.__exit__(None, None, None)
        peaks = phase_peaks(prof, f"s{a.steps - 1}")
    state = torch.tensor([live_tensor_bytes(torch), base] + [peaks.get(ph, 0) for ph in PHASES],
                         dtype=torch.float64)
    dist.all_reduce(state, op=dist.ReduceOp.MAX)
    flat = full_params(torch, model, fw, engine) if a.dump_params else None
    if rank == 0:
        if flat is not None:
            flat.numpy().astype("<f4").tofile(a.dump_params)
        json.dump({"step_s": statistics.median(times[a.warmup:]),
                   "model_state_bytes": int(state[0].item()),
                   "phase_start_bytes": int(state[1].item()),
                   "phase_net_peak": {ph: int(state[2 + i].item())
                                      for i, ph in enumerate(PHASES)} if peaks else None,
                   "num_params": sum(q.numel() for q in Gpt(p["vocab"], p["dim"], p["layers"],
                                                            p["heads"], 8, False,
                                                            tied=p["tied"]).parameters())},
                  open(a.out, "w"))


# ---------------------------------------------------------------------------------------------
# The driver.

def ds_python():
    py = os.path.join(ROOT, ".dsvenv", "bin", "python")
    return py if os.path.exists(py) else sys.executable


# GNU time's line per rank: peak RSS (KiB), user and system CPU seconds, voluntary and
# involuntary context switches (what bench/step_cpu.py reads per step).
TIME_FORMAT = "PEAKRSS %M CPU %U %S CSW %w %c"
RANK_COSTS = []  # the last run()'s per-rank figures, one dict per rank


def run(n, port, argv, env, rss_file, result=None):
    """torchrun with every rank under GNU time; returns the max peak RSS over ranks (bytes) and
    leaves each rank's CPU seconds and context switches in RANK_COSTS.
    `result`: the run's result file; DeepSpeed's ZeRO-3 on the CPU may abort while tearing down
    after writing it, so a failed exit is accepted when that file exists (and said so)."""
    if os.path.exists(rss_file):
        os.remove(rss_file)
    if result and os.path.exists(result):
        os.remove(result)
    cmd = ["torchrun", "--no-python", "--standalone", f"--nproc-per-node={n}",
           f"--master-port={port}", "/usr/bin/time", "-a", "-o", rss_file, "-f", TIME_FORMAT]
    res = subprocess.run(cmd + argv, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        if not (result and os.path.exists(result)):
            sys.exit(f"peers: {' '.join(cmd + argv)} failed:\n{res.stdout[-3000:]}\n"
                     f"{res.stderr[-3000:]}")
        print(f"peers: exit {res.returncode} after the results were written (teardown); "
              f"accepted: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    lines = [line.split() for line in open(rss_file) if line.startswith("PEAKRSS")]
    assert len(lines) == n, f"expected {n} RSS lines, got {lines}"
    RANK_COSTS[:] = [{"cpu_s": float(f[3]) + float(f[4]), "vcsw": int(f[6]), "ivcsw": int(f[7])}
                     for f in lines]
    return max(int(f[1]) for f in lines) * 1024


def one_run(fw, n, dtype, a, port, tmp):
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    rss_file = os.path.join(tmp, "rss.txt")
    out = os.path.join(tmp, f"{fw}-{n}-{dtype}.json")
    if fw.startswith("zero-"):
        argv = [os.path.join(a.build, "examples", "zero-train"),
                "--config", os.path.join(ROOT, "configs", "zero2.yaml"),
                "--set", f"zero_optimization.stage={fw.split('-')[1][1:]}",
                "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}",
                "--set", f"trainer.model={a.model}", "--set", f"trainer.steps={a.steps}",
                "--set", f"trainer.seq_len={a.seq_len}",
                "--set", f"train_micro_batch_size_per_gpu={a.micro}",
                "--set", "gradient_accumulation_steps=1", "--set", "steps_per_print=100000",
                "--set", "no_weight_decay=[]", "--summary-json", out]
        for kv in ZERO_SETS.get(fw, []) + (getattr(a, "zero_set", None) or []):
            argv[-2:-2] = ["--set", kv]
        rss = run(n, port, argv, env, rss_file)
        s = json.load(open(out))
        r = {"step_s": s["step_seconds_median"], "peak_rss": rss,
             "model_state_bytes": max(m["measured"]["total"] for m in s["memory"]),
             "num_params": s["num_params"],
             # The summary's time split (rank 0's means): the step after backward, and what of
             # it waited for the parameter all-gather.
             "optimizer_s": s.get("optimizer_s_mean"),
             "allgather_wait_s": s.get("allgather_wait_s_mean")}
        if a.phases:
            # zero-train's own counting allocator: per phase, the most any rank held (absolute),
            # over the whole run; and the last step's peak over its phases (what the Python
            # frameworks' figures are: their last step).
            r["phase_peak"] = {ph: s["phase_peaks"][ph]["measured"] for ph in PHASES}
            # What the counting allocator held after the last step (max over ranks): what the
            # next step starts from, every CPU storage of the process (model states, the model's
            # buffers, the data), beside the engine's own accounting of model states.
            if s.get("steady_states_bytes", -1) >= 0:
                r["phase_start_bytes"] = s["steady_states_bytes"]
            r["last_step_peak"] = s["phase_step_peaks"][-1]
            r["step_peaks"] = s["phase_step_peaks"]
        return r
    py = ds_python() if fw.startswith("ds") else sys.executable
    argv = [py, os.path.abspath(__file__), "--worker", fw, "--dtype", dtype, "--model", a.model,
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--seq-len", str(a.seq_len),
            "--micro", str(a.micro), "--out", out, "--ref-world", str(n)]
    if a.phases:
        argv.append("--phases")
    if a.check_params:
        argv += ["--dump-params", os.path.join(tmp, f"params-{fw}-{n}-{dtype}.bin")]
    rss = run(1 if fw == "ref" else n, port, argv, env, rss_file, result=out)
    r = json.load(open(out))
    r["peak_rss"] = rss
    if r.get("phase_net_peak"):
        r["phase_peak"] = {ph: r["phase_start_bytes"] + v for ph, v in r["phase_net_peak"].items()}
    return r


def baseline(kind, n, a, port, tmp):
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    rss_file = os.path.join(tmp, "rss.txt")
    if kind == "zero":
        argv = [os.path.join(a.build, "bench", "comm-bench"), "1"]
    else:
        py = ds_python() if kind == "deepspeed" else sys.executable
        argv = [py, os.path.abspath(__file__), "--worker", "none", "--baseline", kind]
    return run(n, port, argv, env, rss_file)


def compare_params(tmp, fw, n, dtype, ref):
    """max |fw - ref| and ||fw - ref|| / ||ref|| over every parameter element."""
    import numpy as np
    x = np.fromfile(os.path.join(tmp, f"params-{fw}-{n}-{dtype}.bin"), dtype="<f4").astype("f8")
    y = np.fromfile(os.path.join(tmp, f"params-{ref}-{n}-{dtype}.bin"), dtype="<f4").astype("f8")
    assert x.shape == y.shape, f"{fw} vs {ref}: {x.shape} vs {y.shape} elements"
    return float(np.max(np.abs(x - y))), float(np.linalg.norm(x - y) / np.linalg.norm(y))


def stage3_main(a):
    """The stage-3 table (issue 33): per rank, model states and each phase's allocator peak, and
    step time, for the frameworks given, plus every framework's final parameters against a
    single-process reference. zero-train's phases come from its own counting allocator
    (summary `phase_peaks`); the Python ones from the profiler's allocator events."""
    if a.frameworks == FRAMEWORKS:
        a.frameworks = ["zero-s2", "zero-s3", "fsdp2-z3", "ds-z3", "ds-z2"]
    a.phases = True
    a.check_params = "fp32" in a.dtypes
    port = 29800 + os.getpid() % 100
    runs, checks = {}, {}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.ranks:
            for dtype in a.dtypes:
                fws = a.frameworks + (["ref"] if dtype == "fp32" else [])
                for fw in fws:
                    port += 1
                    r = one_run(fw, n, dtype, a, port, tmp)
                    runs[(fw, n, dtype)] = r
                    print(f"peers: N={n} {dtype} {fw}: {r['step_s']:.3f} s/step, model states "
                          f"{mib(r['model_state_bytes']):.0f} MiB ({time.time() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
                if dtype == "fp32":
                    for fw in a.frameworks:
                        if not fw.startswith("zero-"):
                            checks[(fw, n)] = compare_params(tmp, fw, n, dtype, "ref")
                    if "ds-z3" in a.frameworks and "fsdp2-z3" in a.frameworks:
                        checks[("ds-z3 vs fsdp2-z3", n)] = compare_params(tmp, "ds-z3", n, dtype,
                                                                          "fsdp2-z3")
    nparams = runs[next(iter(runs))]["num_params"]
    cmd = (f"python3 bench/peers.py --stage3 --model {a.model} --ranks "
           + " ".join(map(str, a.ranks)) + " --dtypes " + " ".join(a.dtypes)
           + " --frameworks " + " ".join(a.frameworks)
           + f" --steps {a.steps} --warmup {a.warmup} --seq-len {a.seq_len} --micro {a.micro}"
           + "".join(f" --zero-set {kv}" for kv in a.zero_set))
    lines = [f"## {a.model} ({nparams / 1e6:.1f} M parameters), stage 3 and its neighbours", "",
             f"`{cmd}`", "",
             "| N | dtype | framework | step (s) | model states (MiB) | step start (MiB) | "
             "forward peak (MiB) | backward peak (MiB) | step peak (MiB) | last-step peak (MiB) "
             "| net peak, last step (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (fw, n, dtype), r in runs.items():
        if fw == "ref":
            continue
        pk = r.get("phase_peak", {})
        start = r.get("phase_start_bytes")
        # The Python frameworks' phase peaks are their last step's; zero-train's are over the
        # run (marked *), its last step's peak is its own column.
        last = r.get("last_step_peak", max(pk.values()) if pk else None)
        net = (last - r["model_state_bytes"]) if last is not None else None
        star = "*" if fw.startswith("zero-") else ""
        lines.append(f"| {n} | {dtype} | {fw} | {r['step_s']:.3f} | "
                     f"{mib(r['model_state_bytes']):.1f} | "
                     + (f"{mib(start):.1f} | " if start is not None else "- | "))
        lines[-1] += " | ".join(f"{mib(pk[ph]):.1f}{star}" if ph in pk else "-" for ph in PHASES)
        # No RSS column: the profiler's event records inflate the Python workers' RSS.
        lines[-1] += (f" | {mib(last):.1f}" if last is not None else " | -")
        lines[-1] += (f" | {mib(net):.1f} |" if net is not None else " | - |")
    if checks:
        lines += ["", f"Final parameters after {a.steps} steps (fp32) against the single-process "
                  "reference (`ref`: one process, torch.optim.AdamW + clip_grad_norm_, the N "
                  "ranks' batches concatenated):", "",
                  "| N | framework | max abs diff | rel diff (norm) |", "|---|---|---|---|"]
        for (fw, n), (ab, rel) in checks.items():
            lines.append(f"| {n} | {fw} | {ab:.2e} | {rel:.2e} |")
    zero_steps = [(fw, n, dtype, r["step_peaks"]) for (fw, n, dtype), r in runs.items()
                  if "step_peaks" in r]
    if zero_steps:
        lines += ["", "zero-train's peak per step (MiB, max over ranks; * above: the most any "
                  "step reached in that phase):", ""]
        for fw, n, dtype, peaks in zero_steps:
            lines.append(f"- N = {n} {dtype} {fw}: " + ", ".join(f"{mib(p):.1f}" for p in peaks))
    json_out = a.out_md_stage3[:-3] + ".json" if a.out_md_stage3.endswith(".md") else ""
    if json_out:
        with open(json_out, "a") as f:
            for (fw, n, dtype), r in runs.items():
                f.write(json.dumps({"model": a.model, "framework": fw, "ranks": n, "dtype": dtype,
                                    **{k: v for k, v in r.items() if k != "params"}}) + "\n")
    text = "\n".join(lines) + "\n"
    if a.out_md_stage3:
        with open(a.out_md_stage3, "a") as f:
            f.write(text + "\n")
    print(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m", choices=sorted(PRESETS))
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--frameworks", nargs="+", default=FRAMEWORKS)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="1 repetition, 4 steps (2 timed)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--zero-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra --set for zero-train (e.g. "
                         "zero_optimization.stage3_max_reuse_distance=0)")
    ap.add_argument("--out-md", default=os.path.join(ROOT, "bench", "results", "peers_cpu.md"))
    ap.add_argument("--stage3", action="store_true",
                    help="the stage-3 set: zero-s2 " + " ".join(STAGE3)
                    + " ds-z2 (or --frameworks), with --phases and --check-params")
    ap.add_argument("--out-md-stage3", default="",
                    help="--stage3: append the table to this file (default: print only)")
    ap.add_argument("--phases", action="store_true",
                    help="per-phase allocator peaks (forward, backward, step) of the last step")
    ap.add_argument("--check-params", action="store_true",
                    help="dump every framework's final parameters and compare them with a "
                         "single-process reference (fp32)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ref-world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dump-params", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.framework = a.worker
    if a.worker:
        return worker(a)
    if a.quick:
        a.reps, a.steps, a.warmup = 1, 4, 2
    if a.stage3:
        return stage3_main(a)
    # zero-train's median skips only its first step; the Python workers skip `warmup`.
    port = 29800 + os.getpid() % 100
    runs, bases = {}, {}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for n in a.ranks:
                for kind in sorted({BASELINE_OF[f] for f in a.frameworks}):
                    port += 1
                    bases.setdefault((kind, n), []).append(baseline(kind, n, a, port, tmp))
                for dtype in a.dtypes:
                    for fw in a.frameworks:
                        port += 1
                        r = one_run(fw, n, dtype, a, port, tmp)
                        runs.setdefault((fw, n, dtype), []).append(r)
                        print(f"peers: rep {rep} N={n} {dtype} {fw}: {r['step_s']:.3f} s/step, "
                              f"peak RSS {mib(r['peak_rss']):.0f} MiB "
                              f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    med = lambda xs: statistics.median(xs)
    nparams = runs[next(iter(runs))][0]["num_params"]
    lines = [f"# zero and its peers on the CPU ({a.model}, {nparams / 1e6:.1f} M parameters)", "",
             f"`python3 bench/peers.py{' --quick' if a.quick else ''}"
             f"{'' if a.model == 'gpt-25m' else ' --model ' + a.model}`: micro-batch {a.micro} x "
             f"{a.seq_len} tokens per rank, AdamW (lr {LR}, betas {BETAS}, weight decay {WD} on "
             f"every parameter), clipping {CLIP}, gloo, {a.steps} steps per run, {a.reps} "
             "interleaved repetition(s) (medians over them). Step time: median of the steps "
             f"after the first {a.warmup} (rank 0; zero-train's own median skips only its first "
             "step). Peak RSS: the max over ranks of GNU time's maximum "
             "resident set, minus the framework's process baseline (imports + gloo process group, "
             "no model: zero "
             + ", ".join(f"N={n} {mib(med(bases[('zero', n)])):.0f} MiB" for n in a.ranks
                         if ("zero", n) in bases)
             + "; torch " + ", ".join(f"N={n} {mib(med(bases[('torch', n)])):.0f} MiB"
                                      for n in a.ranks if ("torch", n) in bases)
             + "; DeepSpeed " + ", ".join(f"N={n} {mib(med(bases[('deepspeed', n)])):.0f} MiB"
                                          for n in a.ranks if ("deepspeed", n) in bases)
             + "). Model states: zero's engine accounting (parameters, gradients, master, "
             "optimizer states, bucket buffers) for zero-train; live tensor storages after the "
             "last step (gc walk, each storage once) for the Python frameworks, which also counts "
             "their flat buffers.", "",
             "Caveats: gloo has no native reduce-scatter; c10d emulates it with an all-reduce, so "
             "ZeRO-2 / FSDP2 gradient traffic is that of an all-reduce (2x the reduce-scatter "
             "volume NCCL would move). The machine (2 cores) was shared with other builds while "
             "this ran: times are noisy, compare within a row group and read ratios, not "
             "absolutes. bf16 for DDP and DDP + ZeroRedundancyOptimizer: a bf16 model with fp32 "
             "master copies (as zero and DeepSpeed keep); FSDP2: MixedPrecisionPolicy(bf16 "
             "params, bf16 reduce) over fp32 sharded parameters.", "",
             "| N | dtype | framework | step (s) | vs DS ZeRO-2 | vs FSDP2 | peak RSS - "
             "baseline (MiB) | vs DS ZeRO-2 | vs FSDP2 | model states (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in a.ranks:
        for dtype in a.dtypes:
            row = {}
            for fw in a.frameworks:
                rs = runs[(fw, n, dtype)]
                net = [r["peak_rss"] - med(bases[(BASELINE_OF[fw], n)]) for r in rs]
                row[fw] = (med([r["step_s"] for r in rs]), med(net),
                           med([r["model_state_bytes"] for r in rs]))
            ds, fs = row.get("ds-z2"), row.get("fsdp2")
            ratio = lambda v, ref, i: f"{v / ref[i]:.2f}x" if ref and ref[i] > 0 else "-"
            for fw in a.frameworks:
                st, net, ms = row[fw]
                lines.append(f"| {n} | {dtype} | {fw} | {st:.3f} | {ratio(st, ds, 0)} | "
                             f"{ratio(st, fs, 0)} | {mib(net):.0f} | {ratio(net, ds, 1)} | "
                             f"{ratio(net, fs, 1)} | {mib(ms):.0f} |")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(a.out_md), exist_ok=True)
    open(a.out_md, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
