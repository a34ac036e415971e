#!/usr/bin/env python3
"""Step time and CPU time per step of zero-s2 beside DeepSpeed ZeRO-2 and FSDP2 at 2 and 4
ranks, from one run, optionally with a second zero build (--before) in the same rows: the bench
of issue 36's 4-rank regression.

Wall time on a shared 2-core machine moves with whatever else runs; CPU seconds per step move
much less, and at 4 ranks on 2 cores every CPU second one rank burns while it waits is a second
the others do not run. Per rank, GNU time's user + system seconds and context switches of a long
run minus those of a short one, divided by the step difference: the start-up (imports, model,
process group) cancels out. The wall step is the long run's median (peers.py's rule).

  python3 bench/step_cpu.py [--ranks 2 4] [--dtypes fp32 bf16] [--reps 2]
                            [--before OTHER_BUILD_DIR] [--out-md FILE]
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from benchlib import ROOT  # noqa: E402

FRAMEWORKS = ["zero-s2", "ds-z2", "fsdp2"]


def costs(fw, n, dtype, a, steps, port, tmp):
    """One run of `steps` steps: its result (step_s) and each rank's CPU seconds and switches."""
    b = copy.copy(a)
    b.steps = steps
    if fw.endswith("@before"):
        fw, b.build = fw[:-len("@before")], a.before
    r = peers.one_run(fw, n, dtype, b, port, tmp)
    return r, [dict(c) for c in peers.RANK_COSTS]


def per_step(long, short, steps):
    """Per rank on average, (long - short) / steps for each figure. GNU time writes the ranks'
    lines as they exit, in no rank order, so only the sums over ranks pair up."""
    n = len(long)
    return {k: (sum(r[k] for r in long) - sum(r[k] for r in short)) / steps / n for k in long[0]}


def loadavg():
    return open("/proc/loadavg").read().split()[:3]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-25m", choices=sorted(peers.PRESETS))
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dtypes", nargs="+", default=["fp32"])
    ap.add_argument("--frameworks", nargs="+", default=FRAMEWORKS)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=9, help="the long run's steps")
    ap.add_argument("--short", type=int, default=3, help="the short run's steps (> --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--before", default="",
                    help="a second build directory: its zero-train runs as zero-s2@before")
    ap.add_argument("--out-md", default="")
    a = ap.parse_args()
    a.phases = a.check_params = False
    assert a.warmup < a.short < a.steps, "need --warmup < --short < --steps"
    fws = list(a.frameworks)
    if a.before:
        fws.insert(fws.index("zero-s2") + 1 if "zero-s2" in fws else 0, "zero-s2@before")
    port = 29700 + os.getpid() % 100
    rows = {}
    t0, load0 = time.time(), loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for n in a.ranks:
                for dtype in a.dtypes:
                    for fw in fws:
                        port += 2
                        r, long = costs(fw, n, dtype, a, a.steps, port, tmp)
                        _, short = costs(fw, n, dtype, a, a.short, port + 1, tmp)
                        ps = per_step(long, short, a.steps - a.short)
                        ps["peak_rss"] = r["peak_rss"]
                        for k in ("optimizer_s", "allgather_wait_s"):
                            ps[k] = r.get(k)
                        rows.setdefault((n, dtype, fw), []).append((r["step_s"], ps))
                        print(f"step_cpu: rep {rep} N={n} {dtype} {fw}: {r['step_s']:.3f} s/step, "
                              f"CPU/step per rank {ps['cpu_s']:.3f}, switches "
                              f"{ps['vcsw']:.0f} + {ps['ivcsw']:.0f} "
                              f"({time.time() - t0:.0f} s, load {' '.join(loadavg())})",
                              file=sys.stderr, flush=True)
    med = statistics.median
    opt = lambda v: "-" if v is None else f"{v:.3f}"
    lines = [f"# Step time and CPU per step: zero-s2 beside DeepSpeed ZeRO-2 and FSDP2 ({a.model})",
             "", f"`python3 bench/step_cpu.py --ranks {' '.join(map(str, a.ranks))} --dtypes "
             f"{' '.join(a.dtypes)} --reps {a.reps}{' --before <build>' if a.before else ''}`: "
             f"{os.cpu_count()} CPUs, load average {' '.join(load0)} at the start, "
             f"{' '.join(loadavg())} at the end ({time.time() - t0:.0f} s). Wall: the median step "
             f"of a {a.steps}-step run (rank 0), median over {a.reps} interleaved repetition(s). "
             f"CPU, switches: per rank, (a {a.steps}-step run - a {a.short}-step run) / "
             f"{a.steps - a.short}, from GNU time (user + system; voluntary, involuntary "
             "context switches), the mean over ranks; medians over the repetitions. Ranks' CPU / "
             "wall: how many cores the N ranks kept busy during a step.", "",
             "| N | dtype | framework | step (s) | vs DS ZeRO-2 | vs FSDP2 | CPU s/step/rank "
             "| ranks' CPU / wall | vol. sw/step/rank | invol. sw/step/rank | optimizer phase (s) "
             "| of which all-gather (s) | peak RSS (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in a.ranks:
        for dtype in a.dtypes:
            fig = {}
            for fw in fws:
                rs = rows[(n, dtype, fw)]
                fig[fw] = dict(step=med([s for s, _ in rs]),
                               **{k: med([ps[k] for _, ps in rs])
                                  for k in ("cpu_s", "vcsw", "ivcsw", "peak_rss")})
                for k in ("optimizer_s", "allgather_wait_s"):
                    v = [ps[k] for _, ps in rs if ps.get(k) is not None]
                    fig[fw][k] = med(v) if v else None
            ratio = lambda fw, ref: (f"{fig[fw]['step'] / fig[ref]['step']:.2f}x"
                                     if ref in fig else "-")
            for fw in fws:
                f = fig[fw]
                lines.append(f"| {n} | {dtype} | {fw} | {f['step']:.3f} | {ratio(fw, 'ds-z2')} | "
                             f"{ratio(fw, 'fsdp2')} | {f['cpu_s']:.3f} | "
                             f"{n * f['cpu_s'] / f['step']:.2f} | {f['vcsw']:.0f} | "
                             f"{f['ivcsw']:.0f} | {opt(f['optimizer_s'])} | "
                             f"{opt(f['allgather_wait_s'])} | {f['peak_rss'] / 2**20:.0f} |")
    text = "\n".join(lines) + "\n"
    if a.out_md:
        open(a.out_md, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
