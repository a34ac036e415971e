"""bench/ds_parity.py's DeepSpeed side: one training run per process under torch.distributed.run
(`ds_parity.py --worker deepspeed`), writing its losses and final parameters next to the inputs."""
import json
import sys

from ds_parity_cases import IN, OUT, make_model


def deepspeed_worker(d, tag="ds"):
    import numpy as np
    import torch
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 (the module, not deepspeed.comm's `torch` name)
    import torch.distributed as dist

    ds_comm_torch = sys.modules["deepspeed.comm.torch"]

    # On the CPU accelerator DeepSpeed JIT-compiles a shared-memory all-reduce when it sets up
    # communication; the brief is "no compiled ops", and gloo does the collectives.
    ds_comm_torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    cfg = json.loads((d / ("ds_config.json" if tag == "ds" else f"{tag}_config.json")).read_text())
    meta = (d / "meta.txt").read_text().split()
    if meta[0] == "llama":
        return deepspeed_llama(d, cfg, rank, tag, *map(int, meta[1:]))
    steps, acc, world, mb, _, _, _ = map(int, meta)
    k, run_world = ranks_per_process(world, cfg, mb)
    model = make_model()
    flat = torch.from_numpy(np.fromfile(d / "init.bin", dtype="<f4"))
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
    x = torch.from_numpy(np.fromfile(d / "x.bin", dtype="<f4")).view(steps, acc, world, mb, IN)
    y = torch.from_numpy(np.fromfile(d / "y.bin", dtype="<f4")).view(steps, acc, world, mb, OUT)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    dtype = next(engine.module.parameters()).dtype

    def loss_of(s, m):
        xs = x[s, m, rank * k:(rank + 1) * k].reshape(-1, IN)
        ys = y[s, m, rank * k:(rank + 1) * k].reshape(-1, OUT)
        out = engine(xs.to(dtype))
        return ((out.float() - ys) ** 2).mean()

    losses = train(engine, steps, acc, run_world, loss_of)
    dump(d, tag, rank, engine, losses, lambda: list(engine.module.parameters()))


def whole_params(engine):
    """At stage 3 every rank holds a slice of each parameter: gather them for the dump (a
    collective, so every rank enters it); below stage 3 the module's parameters are whole."""
    import contextlib
    import deepspeed
    if engine.zero_optimization_stage() == 3:
        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()))
    return contextlib.nullcontext()


def ranks_per_process(world, cfg, mb):
    """How many of the data's ranks each process takes: 1 for the parity run, WORLD / processes
    for the floor run, whose micro-batch is that many ranks' micro-batches side by side."""
    import torch.distributed as dist
    run_world = dist.get_world_size()
    k = world // run_world
    assert k * run_world == world and cfg["train_micro_batch_size_per_gpu"] == k * mb, \
        "floor run: the global batch must stay the same"
    return k, run_world


def deepspeed_llama(d, cfg, rank, tag, steps, acc, world, mb, seq, vocab):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import deepspeed
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
    tok = torch.from_numpy(np.fromfile(d / "tokens.bin", dtype="<i8")).view(steps, acc, world, mb,
                                                                           seq + 1)
    k, run_world = ranks_per_process(world, cfg, mb)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)

    def loss_of(s, m):
        t = tok[s, m, rank * k:(rank + 1) * k].reshape(-1, seq + 1)
        logits = engine(input_ids=t[:, :-1]).logits
        return F.cross_entropy(logits.float().reshape(-1, vocab), t[:, 1:].reshape(-1))

    losses = train(engine, steps, acc, run_world, loss_of)
    names = (d / "names.txt").read_text().split()
    dump(d, tag, rank, engine, losses,
         lambda: [dict(engine.module.named_parameters())[n] for n in names])


def train(engine, steps, acc, run_world, loss_of):
    """Each step's loss, the mean over every rank's micro-batches (`loss_of(step, micro)`)."""
    import torch.distributed as dist
    losses = []
    for s in range(steps):
        total = 0.0
        for m in range(acc):
            loss = loss_of(s, m)
            v = loss.detach().clone().double()
            dist.all_reduce(v)
            total += v.item() / run_world
            engine.backward(loss)
            engine.step()
        losses.append(total / acc)
    return losses


def dump(d, tag, rank, engine, losses, params):
    """Rank 0 writes the losses and the parameters (`params()`, in the inputs' order) whole."""
    import torch
    import torch.distributed as dist
    with whole_params(engine):
        if rank == 0:
            (d / f"{tag}_losses.txt").write_text("".join(f"{v:.17g}\n" for v in losses))
            flat = torch.cat([p.detach().float().reshape(-1) for p in params()])
            flat.numpy().astype("<f4").tofile(d / f"{tag}_params.bin")
    dist.barrier()
