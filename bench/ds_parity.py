#!/usr/bin/env python3
"""Same DeepSpeed JSON, same training: runs each config through zero and through DeepSpeed
itself, side by side, with identical initial weights and batches, and compares per-step loss
and final parameters.

    python3 bench/ds_parity.py            # all cases, 30 steps, table -> bench/results/ds_parity.md

DeepSpeed runs on the CPU (DS_ACCELERATOR=cpu, gloo, `torch_adam: true`: no compiled ops), zero
runs build/bench/ds-parity-zero; both are launched with torch.distributed.run on 2 ranks. If
`import deepspeed` fails, the script installs it into .dsvenv/ (a venv that reuses the installed
torch) first. Acceptance: fp32 per-step loss within 1e-6 relative and final parameters within 1e-5;
bf16 loss within 1e-3 relative and parameters within 1e-3 of their norm (see BF16_NOTE).
Cases s*: an MLP; llama_*: a tiny LlamaForCausalLM (transformers) against zero's example GPT
loaded from the same safetensors. DeepSpeed's own floor: for every llama_* row and two MLP rows
(--floor all: every row) DeepSpeed runs a second time with the same global batch on one rank, and
the table shows that run's difference to the first next to zero's.

    python3 bench/ds_parity.py --cases llama_s2_bf16_adamw --floor none   # one case, no floor
    python3 bench/ds_parity.py --grads    # the two transformer models' gradients, one step
    python3 bench/ds_parity.py --stage3 --side deepspeed   # DeepSpeed ZeRO-3 against its ZeRO-2
    python3 bench/ds_parity.py --stage3   # + zero's stage 3 on the same JSONs
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BF16_NOTE = (
    "bf16 cases start from bf16-representable weights: DeepSpeed casts the module to bf16 before "
    "copying its fp32 master weights, zero keeps the fp32 values as masters (a documented "
    "difference). Both sum the micro-batches' gradients in `grad_accum_dtype` (DeepSpeed's default: "
    "the model dtype, i.e. bf16; stage 0/1 round each rank's local sum, stage 2 the sum of the "
    "reduced micro-steps). bf16 parameters are compared by ||zero - DeepSpeed|| / ||DeepSpeed||: an "
    "absolute 1e-3 is below one bf16 ulp (3.9e-3) for weights in [0.5, 1), so it would demand "
    "bit-identity; the largest absolute difference is listed with its size in bf16 ulps. Every bf16 "
    "row is bit-identical to DeepSpeed over the 30 steps. Every case sets `torch_adam: true`, and "
    "zero then steps as DeepSpeed does (optimizer.params.torch_adam): torch.optim.AdamW's op-by-op "
    "arithmetic, DeepSpeed's gradient norm (fp64 sums over DeepSpeed's contiguous rank partitions "
    "of the parameters in registration order, each rounded to fp32) and its clip multiply. "
    "Before that, the fused AdamW and a norm rounded over zero's own rank split parted the "
    "transformer's bf16 runs after 2 to 12 steps (1.7e-3 to 2.3e-3 in the parameters). That "
    "needed the example GPT to register its block's parameters in LlamaDecoderLayer's order (the "
    "norms last), since DeepSpeed's partitions follow the module's parameter order. The "
    "transformer uses as many key/value heads as query heads: with grouped-query attention "
    "transformers calls SDPA with enable_gqa (the kernel sums the shared heads' gradients in "
    "fp32), the example GPT repeats the key/value heads (autograd sums in bf16), so the bf16 "
    "gradients would differ from the first step on, whatever the engine does. DeepSpeed against "
    "itself misses the bf16 tolerance on every row measured (parameters 2.2e-3 to 3.1e-3 "
    "relative, loss up to 6.0e-3 on the MLP row s1_bf16_adamw_acc2_clip).")
FP32_NOTE = (
    "fp32: every AdamW row, MLP and transformer, is bit-identical to DeepSpeed over 30 steps, "
    "clipping and accumulation included; the SGD rows differ in the last bits (at most 4.0e-7 in "
    "loss and 2.7e-7 in parameters, against tolerances of 1e-6 and 1e-5), which zero's fused SGD "
    "kernel likely explains (not measured). DeepSpeed against itself moves by 8e-8 to 2.4e-7 in "
    "loss, 1.2e-7 to 8.6e-7 in parameters on the rows measured. llama_s2_adamw_acc2_clip missed "
    "by 6.6e-5 until the example GPT computed its RoPE tables with transformers' formula in fp32 "
    "instead of the exact angle in double: `--grads` (one forward/backward of the example GPT and "
    "of LlamaForCausalLM, same weights and token batch, no engine) measured 22646 of 28832 "
    "gradient elements different before, and logits and gradients bit-identical in fp32 and bf16 "
    "after.")
FLOOR_NOTE = (
    "DeepSpeed's own floor (the DS vs DS column): DeepSpeed run a second time on the same JSON with "
    "the same global batch on one rank (micro-batch 2m instead of 2 ranks x m). That is the same "
    "training mathematically; it changes only the order of floating-point sums. Its difference to "
    "the two-rank DeepSpeed run, in the same metrics, is how far DeepSpeed moves from itself under "
    "a reordering, the level below which no engine can be told apart from DeepSpeed. A row that "
    "misses the tolerance says whether zero's difference is at or below that floor (every missed "
    "metric no larger than DeepSpeed's own) or above it. The \"1 rank\" column runs zero on one rank "
    "as well and compares it with that one-rank DeepSpeed run: no reduction, no sharding, so what "
    "differs there is not ZeRO's distributed arithmetic but the models' forward/backward and the "
    "single-rank optimizer step.")
IN, HIDDEN, OUT = 16, 32, 4
WORLD = 2
# The small transformer: a LlamaForCausalLM that zero trains as its example GPT, loaded from the
# same safetensors (models/hf_llama.*): grouped-query attention, untied head.
LLAMA = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
             initializer_range=0.1, bos_token_id=1, eos_token_id=2)
SEQ = 16


# ---------------------------------------------------------------------------------------------
# The model, written identically in bench/ds_parity_zero.cpp: parameters in this order.

def make_model():
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(IN, HIDDEN)
            self.norm = torch.nn.LayerNorm(HIDDEN)
            self.fc2 = torch.nn.Linear(HIDDEN, HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, OUT)

        def forward(self, x):
            h = torch.tanh(self.norm(self.fc1(x)))
            h = torch.tanh(self.fc2(h))
            return self.head(h)

    return Mlp()


def make_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).float()


def is_llama(name):
    return name.startswith("llama_")


# ---------------------------------------------------------------------------------------------
# Cases: DeepSpeed JSON configs. Every Adam uses torch_adam (no compiled ops on the CPU).

def base(stage, micro=4, acc=1):
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": acc,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 500, "allgather_bucket_size": 500},
        "steps_per_print": 1000,
    }


def adamw(lr=1e-2, **params):
    return {"type": "AdamW", "params": {"lr": lr, "torch_adam": True, **params}}


def cases():
    c = {}
    x = base(1); x["optimizer"] = adamw(weight_decay=0.05); x["gradient_clipping"] = 0.0
    c["s1_adamw_const"] = x
    x = base(2); x["optimizer"] = adamw(weight_decay=0.05, betas=[0.9, 0.95]); x["gradient_clipping"] = 0.0
    c["s2_adamw_const"] = x
    x = base(2)
    x["optimizer"] = {"type": "Adam", "params": {"lr": 5e-3, "torch_adam": True, "weight_decay": 0.01}}
    x["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                                     "warmup_num_steps": 8, "warmup_type": "linear"}}
    c["s2_adam_warmuplr"] = x
    x = base(1)
    x["optimizer"] = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}}
    x["zero_allow_untested_optimizer"] = True
    x["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5,
                                                          "warmup_max_lr": 0.05}}
    c["s1_sgd_warmupdecay"] = x
    x = base(2, micro=2, acc=2)
    x["optimizer"] = adamw(weight_decay=0.1)
    x["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5,
                                                           "warmup_min_ratio": 0.1}}
    x["gradient_clipping"] = 0.3
    c["s2_adamw_cosine_acc2_clip"] = x
    x = base(2)  # clipping absent: DeepSpeed's default 1.0
    x["optimizer"] = {"type": "SGD", "params": {"lr": 0.2, "momentum": 0.5}}
    x["zero_allow_untested_optimizer"] = True
    c["s2_sgd_default_clip"] = x
    x = base(2)  # every default: weight_decay (torch AdamW 0.01), warmup_max_lr (0.001), clipping
    x["optimizer"] = {"type": "AdamW", "params": {"lr": 0.5, "torch_adam": True}}
    x["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_num_steps": 4}}
    c["s2_defaults_warmupdecay"] = x
    x = base(2, micro=2, acc=2); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(weight_decay=0.05)
    x["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 3}}
    c["s2_bf16_adamw_cosine_acc2"] = x
    x = base(1); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(weight_decay=0.05); x["gradient_clipping"] = 0.5
    c["s1_bf16_adamw_clip"] = x
    # The same with fp32 gradient accumulation, which is what zero does (DeepSpeed then uses its
    # BF16_Optimizer for stage 1): isolates the bf16-accumulation part of the difference.
    x = copy.deepcopy(x); x["data_types"] = {"grad_accum_dtype": "fp32"}
    c["s1_bf16_fp32accum_clip"] = x
    # bf16 with accumulation under DeepSpeed's default grad_accum_dtype (bf16) at stage 1, where
    # the sums are local, and an explicit fp32 one at stage 2.
    x = base(1, micro=2, acc=2); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(weight_decay=0.05); x["gradient_clipping"] = 0.5
    c["s1_bf16_adamw_acc2_clip"] = x
    x = copy.deepcopy(c["s2_bf16_adamw_cosine_acc2"]); x["data_types"] = {"grad_accum_dtype": "fp32"}
    c["s2_bf16_fp32accum_acc2"] = x
    # The small transformer (names starting llama_): token batches, cross-entropy.
    x = base(1, micro=2); x["optimizer"] = adamw(lr=3e-3, weight_decay=0.05)
    x["scheduler"] = {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5}}
    c["llama_s1_adamw_cosine"] = x
    x = base(2, micro=2, acc=2); x["optimizer"] = adamw(lr=3e-3, weight_decay=0.05, betas=[0.9, 0.95])
    x["gradient_clipping"] = 0.5
    c["llama_s2_adamw_acc2_clip"] = x
    x = base(2, micro=4); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(lr=3e-3, weight_decay=0.05)
    c["llama_s2_bf16_adamw"] = x
    x = base(2, micro=2, acc=2); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(lr=3e-3, weight_decay=0.05)
    c["llama_s2_bf16_adamw_acc2"] = x
    x = base(1, micro=2, acc=2); x["bf16"] = {"enabled": True}
    x["optimizer"] = adamw(lr=3e-3, weight_decay=0.05)
    c["llama_s1_bf16_adamw_acc2"] = x
    # Stage 3 (only with --stage3 or named in --cases): stage-2 rows with "stage": 3 and the
    # stage3_* keys set so that DeepSpeed partitions every parameter (persistence threshold 0:
    # no parameter kept whole) and gathers in small buckets (several all-gathers per forward).
    for s2 in STAGE3_FROM:
        x = copy.deepcopy(c[s2])
        x["zero_optimization"].update({"stage": 3, "stage3_param_persistence_threshold": 0,
                                       "stage3_prefetch_bucket_size": 500,
                                       "stage3_max_live_parameters": 2000})
        c[s2.replace("s2_", "s3_")] = x
    # The two transformer rows again without clipping: DeepSpeed's ZeRO-3 computes the clipping
    # norm in another order than its ZeRO-2 (see STAGE3_NOTE); without clipping the norm is not
    # used, which tells that difference apart from any other.
    for s3 in ("llama_s3_adamw_acc2_clip", "llama_s3_bf16_adamw"):
        x = copy.deepcopy(c[s3])
        x["gradient_clipping"] = 0.0
        c[s3.replace("_clip", "") + "_noclip"] = x
    return c


# The stage-2 cases that get a stage-3 twin (s3_*): DeepSpeed's ZeRO-2 run of the twin's JSON
# is the reference zero's stage 3 is held to (same training mathematically; STAGE3_NOTE).
STAGE3_FROM = ("s2_adamw_const", "s2_adamw_cosine_acc2_clip", "s2_sgd_default_clip",
               "s2_bf16_adamw_cosine_acc2", "llama_s2_adamw_acc2_clip", "llama_s2_bf16_adamw")


def is_stage3(name):
    return "s3_" in name


def stage2_twin(cfg):
    t = copy.deepcopy(cfg)
    t["zero_optimization"]["stage"] = 2
    for k in [k for k in t["zero_optimization"] if k.startswith("stage3_")]:
        del t["zero_optimization"][k]
    return t


# ---------------------------------------------------------------------------------------------
# Data: initial weights and every rank's micro-batches, as raw little-endian float32.

def write_llama_inputs(d, cfg, steps):
    import torch
    torch.manual_seed(1234)
    model = make_llama()
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # norms start at 1: give them values to learn from
            if bf16:
                p.copy_(p.bfloat16().float())  # see write_inputs
    model.save_pretrained(d / "hf")
    (d / "names.txt").write_text("".join(n + "\n" for n, _ in model.named_parameters()))
    mb, acc = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    g = torch.Generator().manual_seed(99)
    # A learnable stream: each row counts up from a random start (mod vocab), some noise.
    start = torch.randint(0, LLAMA["vocab_size"], (steps, acc, WORLD, mb, 1), generator=g)
    tok = (start + torch.arange(SEQ + 1)) % LLAMA["vocab_size"]
    noise = torch.rand(tok.shape, generator=g) < 0.1
    tok = torch.where(noise, torch.randint_like(tok, LLAMA["vocab_size"], generator=g), tok)
    tok.numpy().astype("<i8").tofile(d / "tokens.bin")
    (d / "meta.txt").write_text(f"llama {steps} {acc} {WORLD} {mb} {SEQ} {LLAMA['vocab_size']}\n")
    (d / "ds_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def write_inputs(d, cfg, steps):
    import torch
    torch.manual_seed(1234)
    model = make_model()
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
            # DeepSpeed casts the module to bf16 before it copies the fp32 master weights, so
            # its masters start from bf16-rounded values; zero's start from the fp32 values.
            # Starting from bf16-representable weights makes both start from the same masters.
            if bf16:
                p.copy_(p.bfloat16().float())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "init.bin")
    mb, acc = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    g = torch.Generator().manual_seed(99)
    x = torch.randn(steps, acc, WORLD, mb, IN, generator=g)
    w = torch.linspace(-1, 1, IN * OUT).reshape(IN, OUT)
    y = torch.sin(x @ w) + 0.1 * torch.randn(steps, acc, WORLD, mb, OUT, generator=g)
    x.numpy().astype("<f4").tofile(d / "x.bin")
    y.numpy().astype("<f4").tofile(d / "y.bin")
    (d / "meta.txt").write_text(f"{steps} {acc} {WORLD} {mb} {IN} {HIDDEN} {OUT}\n")
    (d / "ds_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# The DeepSpeed side (run under torch.distributed.run).

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
    losses = []
    for s in range(steps):
        total = 0.0
        for m in range(acc):
            xs = x[s, m, rank * k:(rank + 1) * k].reshape(-1, IN)
            ys = y[s, m, rank * k:(rank + 1) * k].reshape(-1, OUT)
            out = engine(xs.to(dtype))
            loss = ((out.float() - ys) ** 2).mean()
            t = loss.detach().clone().double()
            dist.all_reduce(t)
            total += t.item() / run_world
            engine.backward(loss)
            engine.step()
        losses.append(total / acc)
    with whole_params(engine):
        if rank == 0:
            (d / f"{tag}_losses.txt").write_text("".join(f"{v:.17g}\n" for v in losses))
            flat = torch.cat([p.detach().float().reshape(-1) for p in engine.module.parameters()])
            flat.numpy().astype("<f4").tofile(d / f"{tag}_params.bin")
    dist.barrier()


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
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
    tok = torch.from_numpy(np.fromfile(d / "tokens.bin", dtype="<i8")).view(steps, acc, world, mb,
                                                                           seq + 1)
    k, run_world = ranks_per_process(world, cfg, mb)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = []
    for s in range(steps):
        total = 0.0
        for m in range(acc):
            t = tok[s, m, rank * k:(rank + 1) * k].reshape(-1, seq + 1)
            logits = engine(input_ids=t[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), t[:, 1:].reshape(-1))
            v = loss.detach().clone().double()
            dist.all_reduce(v)
            total += v.item() / run_world
            engine.backward(loss)
            engine.step()
        losses.append(total / acc)
    with whole_params(engine):
        if rank == 0:
            (d / f"{tag}_losses.txt").write_text("".join(f"{v:.17g}\n" for v in losses))
            params = dict(engine.module.named_parameters())
            names = (d / "names.txt").read_text().split()
            flat = torch.cat([params[n].detach().float().reshape(-1) for n in names])
            flat.numpy().astype("<f4").tofile(d / f"{tag}_params.bin")
    dist.barrier()


# ---------------------------------------------------------------------------------------------

def launch(python, script_args, env, log, nproc=WORLD, results=()):
    """`results`: files the run writes at its end. DeepSpeed 0.19.8's ZeRO-3 on the CPU may abort
    while tearing down after writing them (in a fresh directory), so a failed exit is accepted
    when they all exist, and said so."""
    cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(29600 + os.getpid() % 300)] + script_args
    with open(log, "w") as f:
        r = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    if r.returncode != 0 and results and all(Path(p).exists() for p in results):
        print(f"ds_parity: exit {r.returncode} after the results were written (DeepSpeed's ZeRO-3 "
              f"tearing down on the CPU); results kept, see {log}", flush=True)
        return
    if r.returncode != 0:
        sys.exit(f"ds_parity: {' '.join(cmd)} failed (exit {r.returncode}); see {log}")


def deepspeed_python():
    """A python that imports deepspeed: this one, or .dsvenv/ (created on first use)."""
    probe = [sys.executable, "-c", "import deepspeed"]
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    if subprocess.run(probe, env=env, capture_output=True).returncode == 0:
        return sys.executable
    venv = ROOT / ".dsvenv"
    py = venv / "bin" / "python"
    if not py.exists():
        print("ds_parity: installing deepspeed into .dsvenv (reuses the installed torch)")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import deepspeed"], env=env, capture_output=True).returncode:
        subprocess.run([str(py), "-m", "pip", "install", "-q", "deepspeed"], check=True)
    return str(py)


def floor_config(cfg):
    """DeepSpeed's own floating-point floor: the same global batch on one rank (micro-batch
    WORLD x m instead of WORLD ranks x m). Mathematically the same training (every loss is a
    mean over equally many samples, so the mean of the ranks' means is the mean over their
    union); it changes only the order of floating-point sums (per-sample gradient sums inside
    the matmuls instead of the cross-rank reduction, clipping norm over one partition)."""
    f = copy.deepcopy(cfg)
    f["train_micro_batch_size_per_gpu"] = cfg["train_micro_batch_size_per_gpu"] * WORLD
    f.pop("train_batch_size", None)  # derived: micro x accumulation x ranks, unchanged
    return f


# The rows whose DeepSpeed-vs-DeepSpeed floor the default run measures (--floor all: every row).
FLOOR_DEFAULT = ("s2_adamw_cosine_acc2_clip", "s1_bf16_adamw_acc2_clip")


def compare(d, bf16, ours="zero", ref="ds"):
    import numpy as np
    ds_l = np.array([float(v) for v in (d / f"{ref}_losses.txt").read_text().split()])
    z_l = np.array([float(v) for v in (d / f"{ours}_losses.txt").read_text().split()])
    ds_p = np.fromfile(d / f"{ref}_params.bin", dtype="<f4").astype(np.float64)
    z_p = np.fromfile(d / f"{ours}_params.bin", dtype="<f4").astype(np.float64)
    assert ds_l.shape == z_l.shape and ds_p.shape == z_p.shape, "shape mismatch"
    loss_rel = float(np.max(np.abs(ds_l - z_l) / np.maximum(np.abs(ds_l), 1e-30)))
    diff = np.abs(ds_p - z_p)
    param_abs = float(np.max(diff))
    param_rel = float(np.linalg.norm(ds_p - z_p) / np.linalg.norm(ds_p))
    # The largest difference in bf16 ulps of the value where it occurs: 2^(exponent - 7).
    i = int(np.argmax(diff))
    ulps = float(diff[i] / np.exp2(np.floor(np.log2(max(abs(ds_p[i]), abs(z_p[i]), 1e-30))) - 7))
    loss_tol, param_tol = (1e-3, 1e-3) if bf16 else (1e-6, 1e-5)
    ok = loss_rel <= loss_tol and (param_rel if bf16 else param_abs) <= param_tol
    return loss_rel, param_abs, param_rel, ulps, loss_tol, param_tol, ok, ds_l


def grads_check(zero_bin, out):
    """One forward/backward of the example GPT and of LlamaForCausalLM on the same weights and
    token batch (llama_s2_adamw_acc2_clip's first micro-batch), fp32 and bf16: the models'
    arithmetic alone, without an engine or an optimizer. Returns the report lines."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
    d = out / "grads"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    write_llama_inputs(d, cases()["llama_s2_adamw_acc2_clip"], 1)
    subprocess.run([zero_bin, str(d), "grads"], check=True)
    mb = cases()["llama_s2_adamw_acc2_clip"]["train_micro_batch_size_per_gpu"]
    tok = torch.from_numpy(np.fromfile(d / "tokens.bin", dtype="<i8")[:mb * (SEQ + 1)]).view(mb, -1)
    names = (d / "names.txt").read_text().split()
    lines = []
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = LlamaForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
        for p in model.parameters():  # DeepSpeed casts the parameters only: buffers stay fp32
            p.data = p.data.to(dtype)
        logits = model(input_ids=tok[:, :-1]).logits
        F.cross_entropy(logits.float().reshape(-1, LLAMA["vocab_size"]), tok[:, 1:].reshape(-1)).backward()
        params = dict(model.named_parameters())
        z_logits = torch.from_numpy(np.fromfile(d / f"zero_logits_{tag}.bin", dtype="<f4"))
        z_grads = torch.from_numpy(np.fromfile(d / f"zero_grads_{tag}.bin", dtype="<f4"))
        ldiff = (z_logits - logits.detach().float().reshape(-1)).abs().max().item()
        worst, worst_rel, differ, off = (0.0, ""), 0.0, 0, 0
        for n in names:
            ref = params[n].grad.float().reshape(-1)
            z = z_grads[off:off + ref.numel()]
            off += ref.numel()
            diff = (z - ref).abs()
            worst = max(worst, (diff.max().item(), n))
            worst_rel = max(worst_rel, (diff / ref.abs().clamp_min(1e-30)).max().item())
            differ += int((diff > 0).sum())
        lines.append(f"{tag}: logits max abs diff {ldiff:.1e}; gradients: max abs diff {worst[0]:.1e}"
                     f"{f' ({worst[1]})' if worst[0] else ''}, max rel diff {worst_rel:.1e}, "
                     f"{differ} of {off} elements differ")
    return lines


STAGE3_NOTE = (
    "Why DeepSpeed's ZeRO-3 is not its ZeRO-2 to the bit (DeepSpeed 0.19.8, runtime/zero/stage3.py "
    "against stage_1_and_2.py), and what zero's stage 3 does about it. (1) The clipping norm: "
    "ZeRO-3's get_grad_norm_direct sums the squared fp64 norms of every parameter's own 1/N slice "
    "and all-reduces that sum in fp64, its clip coefficient fp64 too; ZeRO-2 sums over each "
    "rank's contiguous partition of the flat buffer and rounds the sum to fp32 before the "
    "all-reduce. With clipping active the clip coefficient differs in its last bits, and every "
    "gradient with it (llama_s3_bf16_adamw: DS-3 vs DS-2 1.7e-3; without clipping, "
    "llama_s3_bf16_adamw_noclip, bit-identical). zero's stage 3 under torch_adam takes ZeRO-3's "
    "fp64 norm and coefficient (zero/step/deepspeed_norm.hpp), rounded to fp32 only where it "
    "multiplies the gradient, as DeepSpeed's mul_ by a 0-dim fp64 tensor rounds it; its stages 1-2 "
    "keep ZeRO-2's rule. (2) In fp32 the transformer's gradients themselves differ: one SGD step "
    "without clipping leaves lm_head, the final norm and layer 1's MLP and norms bit-identical and "
    "moves layer 1's attention projections and everything below them (layer 0, the embedding) by "
    "1-2 ulp in 3-12 % of their elements; bf16 rounds that away. zero's stage 3 keeps the model's "
    "own autograd and stage 2's reduce-scatter, so on the fp32 transformer rows it stays within "
    "tolerance of DeepSpeed's ZeRO-2 and misses DeepSpeed's ZeRO-3 by DeepSpeed's ZeRO-3's own "
    "distance to its ZeRO-2 (rows marked so). The SGD rows differ in the last bits at stage 2 too "
    "(ds_parity.md: 4.0e-7 in loss and 2.7e-7 in parameters), within tolerance.")


def stage3_table(z3_rows, ds_version, steps):
    """DeepSpeed ZeRO-3 against DeepSpeed ZeRO-2 on the same JSON (only the stage and the
    stage3_* keys differ), and zero's stage 3 on that JSON against both."""
    with_zero = any(r[4] is not None for r in z3_rows)
    lines = [f"# DeepSpeed {ds_version} ZeRO-3, its ZeRO-2 and zero's stage 3: same JSON, same "
             "training", "",
             f"`python3 bench/ds_parity.py --stage3` ({steps} optimizer steps, "
             f"{WORLD} ranks, CPU/gloo, DS_ACCELERATOR=cpu, torch_adam). Each s3_* case is the "
             "s2_* case of bench/results/ds_parity.md with \"stage\": 3, "
             "stage3_param_persistence_threshold 0 (every parameter partitioned), "
             "stage3_prefetch_bucket_size 500 and stage3_max_live_parameters 2000 (several "
             "gathers and releases per forward); DeepSpeed also runs the same JSON at stage 2 "
             "(the stage3_* keys removed). zero trains the JSON unchanged (build/bench/"
             "ds-parity-zero: the MLP's four layers each a unit, the example GPT's blocks each a "
             "unit). Same tolerances as the parity table (fp32: loss 1e-6 "
             "relative, parameters 1e-5 absolute; bf16: 1e-3 relative each). Each cell: loss rel "
             "/ param abs / param rel; `0` is bit-identical. Result: zero's stage 3 against "
             "DeepSpeed's ZeRO-3 on the same JSON (see below for the fp32 transformer rows).", "",
             "| case | optimizer | accum | clip | dtype | DS-3 vs DS-2 | "
             + ("zero-3 vs DS-2 | zero-3 vs DS-3 | " if with_zero else "")
             + "tolerance | result |",
             "|---|---|---|---|---|---|" + ("---|---|" if with_zero else "") + "---|---|"]

    def cell(z):
        return "0" if z[0] == z[1] == z[2] == 0 else f"{z[0]:.1e} / {z[1]:.1e} / {z[2]:.1e}"

    for name, cfg, bf16, z, zero2, zero3 in z3_rows:
        lines.append(f"| {name} | {cfg['optimizer']['type']} | "
                     f"{cfg['gradient_accumulation_steps']} | "
                     f"{cfg.get('gradient_clipping', '1.0 (default)')} | "
                     f"{'bf16' if bf16 else 'fp32'} | {cell(z)} | "
                     + (f"{cell(zero2)} | {cell(zero3)} | " if with_zero else "")
                     + f"{z[4]:g} / {z[5]:g} {'rel' if bf16 else 'abs'} | ")
        if not with_zero:
            lines[-1] += f"{'ok' if z[6] else 'FAIL'} (DS-3 vs DS-2) |"
            continue
        if zero3[6]:
            verdict = "ok" + (", bit-identical to DS-3" if zero3[:3] == (0.0, 0.0, 0.0) else "")
        elif zero2[6] and not z[6]:
            verdict = "ok vs DS-2; off DS-3 by DS-3's own distance to DS-2"
        else:
            verdict = "FAIL"
        lines[-1] += verdict + " |"
    return "\n".join(lines) + "\n\n" + STAGE3_NOTE + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--cases", default="", help="comma-separated subset of case names")
    ap.add_argument("--out", default=str(ROOT / "out" / "ds_parity"))
    ap.add_argument("--zero-bin", default=str(ROOT / "build" / "bench" / "ds-parity-zero"))
    ap.add_argument("--side", choices=["both", "deepspeed", "zero", "floor", "none"], default="both",
                    help="run one side only (zero: reuse the DeepSpeed results already in --out; "
                         "floor: only DeepSpeed's second, one-rank run; none: tabulate the results "
                         "already there)")
    ap.add_argument("--floor", choices=["default", "all", "none"], default="default",
                    help="rows that get DeepSpeed's own floor (a second DeepSpeed run, the same "
                         "global batch on one rank): default every llama_* row and "
                         + ", ".join(FLOOR_DEFAULT))
    ap.add_argument("--grads", action="store_true",
                    help="only compare one forward/backward of the two transformer models "
                         "(example GPT vs LlamaForCausalLM, same weights and batch, fp32 and bf16)")
    ap.add_argument("--stage3", action="store_true",
                    help="the stage-3 cases (s3_*) instead of the others; each also runs DeepSpeed "
                         "at stage 2 on the same JSON as its reference "
                         "(-> bench/results/ds_parity_stage3.md)")
    ap.add_argument("--worker", choices=["deepspeed"], help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="ds", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return deepspeed_worker(Path(a.dir), a.tag)

    if a.side in ("both", "zero") and not Path(a.zero_bin).exists():
        subprocess.run(["ninja", "-C", str(ROOT / "build"), "-j2", "ds-parity-zero"], check=True)
    if a.grads:
        print("\n".join(grads_check(a.zero_bin, Path(a.out))))
        return
    ds_py = deepspeed_python()
    ds_version = subprocess.run([ds_py, "-c", "import deepspeed; print(deepspeed.__version__)"],
                                env=dict(os.environ, DS_ACCELERATOR="cpu"), capture_output=True,
                                text=True).stdout.strip().splitlines()[-1]
    out = Path(a.out)
    selected = cases()
    if a.cases:
        selected = {k: v for k, v in selected.items() if k in a.cases.split(",")}
    else:
        selected = {k: v for k, v in selected.items() if is_stage3(k) == a.stage3}
    rows, z3_rows = [], []
    for name, cfg in selected.items():
        d = out / name
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        if a.side in ("both", "deepspeed"):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            (write_llama_inputs if is_llama(name) else write_inputs)(d, copy.deepcopy(cfg), a.steps)
            print(f"ds_parity: {name}: DeepSpeed {ds_version} ...", flush=True)
            launch(ds_py, [str(Path(__file__).resolve()), "--worker", "deepspeed", "--dir", str(d)],
                   env, d / "deepspeed.log",
                   results=(d / "ds_losses.txt", d / "ds_params.bin") if is_stage3(name) else ())
        wants_floor = a.floor == "all" or (a.floor == "default" and not is_stage3(name) and
                                            (is_llama(name) or name in FLOOR_DEFAULT))
        if a.side in ("both", "deepspeed") and is_stage3(name):
            (d / "z2_config.json").write_text(json.dumps(stage2_twin(cfg), indent=2) + "\n")
            print(f"ds_parity: {name}: DeepSpeed, the same JSON at stage 2 ...", flush=True)
            launch(ds_py, [str(Path(__file__).resolve()), "--worker", "deepspeed", "--dir", str(d),
                           "--tag", "z2"], env, d / "z2.log")
        if a.side in ("both", "deepspeed", "floor") and wants_floor:
            (d / "floor_config.json").write_text(json.dumps(floor_config(cfg), indent=2) + "\n")
            print(f"ds_parity: {name}: DeepSpeed floor (1 rank, micro-batch x{WORLD}) ...", flush=True)
            launch(ds_py, [str(Path(__file__).resolve()), "--worker", "deepspeed", "--dir", str(d),
                           "--tag", "floor"], env, d / "floor.log", nproc=1)
        bf16 = cfg.get("bf16", {}).get("enabled", False)
        if a.side not in ("deepspeed", "floor", "none"):
            print(f"ds_parity: {name}: zero ...", flush=True)
            launch(sys.executable, ["--no-python", a.zero_bin, str(d)], env, d / "zero.log")
        if is_stage3(name) and (d / "z2_losses.txt").exists():
            z3 = compare(d, bf16, "ds", "z2")
            has_zero = a.side not in ("deepspeed", "floor") and (d / "zero_losses.txt").exists()
            zero2 = compare(d, bf16, "zero", "z2") if has_zero else None
            zero3 = compare(d, bf16, "zero", "ds") if has_zero else None
            z3_rows.append((name, cfg, bf16, z3, zero2, zero3))
            print(f"ds_parity: {name}: DeepSpeed ZeRO-3 vs ZeRO-2: loss rel {z3[0]:.2e}, params abs "
                  f"{z3[1]:.2e}, rel {z3[2]:.2e}: {'ok' if z3[6] else 'FAIL'}"
                  + (f"; zero-3 vs DS-2: {zero2[0]:.2e} / {zero2[1]:.2e} / {zero2[2]:.2e}: "
                     f"{'ok' if zero2[6] else 'FAIL'}" if zero2 else ""), flush=True)
        if a.side in ("deepspeed", "floor"):
            continue
            if wants_floor and (d / "floor_config.json").exists():
                # zero on one rank too: against DeepSpeed on one rank, what differs without
                # any reduction or sharding (the models, the single-rank step).
                launch(sys.executable, ["--no-python", a.zero_bin, str(d), "floor"], env,
                       d / "zero_floor.log", nproc=1)
        loss_rel, param_abs, param_rel, ulps, lt, pt, ok, ds_l = compare(d, bf16)
        floor = compare(d, bf16, "floor", "ds") if (d / "floor_losses.txt").exists() else None
        one = (compare(d, bf16, "zero_floor", "floor")
               if floor and (d / "zero_floor_losses.txt").exists() else None)
        verdict = "ok" if ok else "FAIL"
        if not ok and floor:
            # Each metric zero misses, against the same metric of DeepSpeed against itself.
            missed = [(loss_rel, floor[0])] if loss_rel > lt else []
            if (param_rel if bf16 else param_abs) > pt:
                missed.append((param_rel, floor[2]) if bf16 else (param_abs, floor[1]))
            verdict = ("FAIL, at/below DS floor" if all(z <= f for z, f in missed)
                       else "FAIL, above DS floor")
        rows.append((name, cfg, bf16, loss_rel, param_abs, param_rel, ulps, lt, pt, verdict, floor,
                     one))
        fl = (f"; DS floor: loss rel {floor[0]:.2e}, params abs {floor[1]:.2e}, rel {floor[2]:.2e}"
              if floor else "")
        print(f"ds_parity: {name}: loss rel {loss_rel:.2e} (tol {lt:g}), params abs {param_abs:.2e}, "
              f"rel {param_rel:.2e} (tol {pt:g} {'rel' if bf16 else 'abs'}){fl}: {verdict}",
              flush=True)

    lines = [f"# zero vs DeepSpeed {ds_version}: same JSON, same training",
             "",
             f"`python3 bench/ds_parity.py` ({a.steps} optimizer steps, {WORLD} ranks, CPU/gloo, "
             f"cases s*: MLP {IN}-{HIDDEN}-LayerNorm-{HIDDEN}-{OUT}; cases llama_*: a "
             f"{LLAMA['num_hidden_layers']}-layer LlamaForCausalLM (dim {LLAMA['hidden_size']}, "
             f"{LLAMA['num_attention_heads']} heads / {LLAMA['num_key_value_heads']} kv heads, vocab "
             f"{LLAMA['vocab_size']}, seq {SEQ}) against zero's example GPT loaded from the same "
             "safetensors, cross-entropy on token batches; identical initial weights and batches; "
             "DeepSpeed with DS_ACCELERATOR=cpu and torch_adam). Max over steps of the relative "
             "per-step loss difference; max absolute difference of the final parameters, and "
             "||zero - DeepSpeed|| / ||DeepSpeed|| over them.",
             "",
             FLOOR_NOTE,
             "",
             "| case | stage | optimizer | scheduler | accum | clip | dtype | grad_accum_dtype | "
             "loss rel diff | param abs diff | param rel diff | DS vs DS floor: loss rel / param "
             "abs / param rel | 1 rank, zero vs DS: loss rel / param abs / param rel | tolerance | "
             "result |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, cfg, bf16, lr, pa, prel, ulps, lt, pt, verdict, floor, one in rows:
        accum = cfg.get("data_types", {}).get("grad_accum_dtype", "model dtype")
        sched = cfg.get("scheduler", {}).get("type", "-")
        clip = cfg.get("gradient_clipping", "1.0 (default)")
        lines.append(f"| {name} | {cfg['zero_optimization']['stage']} | {cfg['optimizer']['type']} | "
                     f"{sched} | {cfg['gradient_accumulation_steps']} | {clip} | "
                     f"{'bf16' if bf16 else 'fp32'} | {accum if bf16 else '-'} | {lr:.1e} | "
                     f"{pa:.1e}{f' ({ulps:.0f} ulp)' if bf16 else ''} | {prel:.1e} | "
                     + (f"{floor[0]:.1e} / {floor[1]:.1e}{f' ({floor[3]:.0f} ulp)' if bf16 else ''}"
                        f" / {floor[2]:.1e} | " if floor else "- | ")
                     + (f"{one[0]:.1e} / {one[1]:.1e} / {one[2]:.1e} | " if one else "- | ")
                     + f"{lt:g} / {pt:g} {'rel' if bf16 else 'abs'} | {verdict} |")
    lines += ["", FP32_NOTE, "", BF16_NOTE]
    text = "\n".join(lines) + "\n"
    if z3_rows:
        z3_text = stage3_table(z3_rows, ds_version, a.steps)
        print(z3_text)
        if a.stage3 and not a.cases:
            res = ROOT / "bench" / "results" / "ds_parity_stage3.md"
            # Below the stage-3 table: zero's stage 3 against DeepSpeed's ZeRO-3 in the parity
            # table's columns (a subsection of this file).
            res.write_text(z3_text + ("" if a.side in ("deepspeed", "floor") else
                                      "\n#" + text.replace(" same JSON, same training",
                                                            " ZeRO-3, same JSON", 1)))
            print(f"ds_parity: stage-3 table written to {res}")
    if a.side in ("deepspeed", "floor"):
        print(f"ds_parity: DeepSpeed results in {out}; run with --side zero to compare")
        sys.exit(0 if all(r[3][6] for r in z3_rows) else 1)
    if not a.cases and not a.stage3:
        res = ROOT / "bench" / "results" / "ds_parity.md"
        res.write_text(text)
        print(f"ds_parity: table written to {res}")
    print(text)
    # Stage 3: zero is held to DeepSpeed's ZeRO-2 on the same JSON (STAGE3_NOTE); the main table
    # below it still says how far zero's stage 3 is from DeepSpeed's ZeRO-3.
    ok3 = all(r[4][6] for r in z3_rows if r[4] is not None)
    ok = all(r[9] == "ok" for r in rows if not is_stage3(r[0]))
    sys.exit(0 if ok and ok3 else 1)


if __name__ == "__main__":
    main()
