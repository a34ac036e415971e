#!/usr/bin/env python3
"""gloo's reduce-scatter against an all-to-all plus a local sum (what zero's gloo groups run,
comm/c10d_group.cpp reduce_scatter_by_all_to_all), and against an all-reduce: wall and CPU
seconds per call on each rank, one process per rank on this machine.

  python3 bench/gloo_reduce_scatter.py [RANKS] [ELEMENTS] [REPS]     (default 4 6000000 5)
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, n, reps, q):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "29613"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.randn(n)
    out = torch.empty(n // world)
    names = ["reduce_scatter", "all_to_all+sum", "all_reduce"]

    def once(name):
        if name == "reduce_scatter":
            dist.reduce_scatter_tensor(out, x)
        elif name == "all_to_all+sum":
            y = torch.empty_like(x)
            dist.all_to_all_single(y, x)
            parts = y.view(world, -1)
            torch.add(parts[0], parts[1], out=out)
            for r in range(2, world):
                out.add_(parts[r])
        else:
            y = x.clone()
            dist.all_reduce(y)
            out.copy_(y.view(world, -1)[rank])

    for name in names:  # warm-up: buffers and connections once each
        once(name)
    cpu = {k: 0.0 for k in names}
    wall = {k: 0.0 for k in names}
    for i in range(reps):
        for name in names[i % 3:] + names[:i % 3]:  # rotated, so no method always goes first
            dist.barrier()
            c0, w0 = time.process_time(), time.perf_counter()
            once(name)
            dist.barrier()
            cpu[name] += time.process_time() - c0
            wall[name] += time.perf_counter() - w0
    res = {k: (cpu[k] / reps, wall[k] / reps) for k in names}
    a = torch.empty(n // world)
    dist.reduce_scatter_tensor(a, x)
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    res["max |difference|"] = (a - y.view(world, -1).sum(0)).abs().max().item()
    q.put((rank, res))
    dist.destroy_process_group()


if __name__ == "__main__":
    world, n, reps = (int(v) for v in (sys.argv[1:] + ["4", "6000000", "5"][len(sys.argv) - 1:]))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=run, args=(r, world, n, reps, q)) for r in range(world)]
    for p in ps:
        p.start()
    out = sorted(q.get() for _ in ps)
    for p in ps:
        p.join()
    print(f"{world} ranks, {n} fp32 elements, {reps} calls; per call: (CPU s, wall s) per rank")
    for r, res in out:
        print(r, {k: tuple(round(x, 4) for x in v) if isinstance(v, tuple) else v
                  for k, v in res.items()})
