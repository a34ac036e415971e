"""bench/ds_parity.py's cases: the two models (an MLP and a tiny LlamaForCausalLM), the DeepSpeed
JSONs, and the inputs every run reads (initial weights, every rank's micro-batches)."""
import copy
import json

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
