"""transformers' side of the Hugging Face round-trip test (tests/e2e/hf_llama_roundtrip.sh).

  hf_llama.py make DIR TOKENS [VARIANT]
                                   a tiny random LlamaForCausalLM saved with save_pretrained
                                   (sharded), and token sequences for it; VARIANT "tied": with
                                   tie_word_embeddings (lm_head is the embedding, not saved);
                                   another name of VARIANTS below: that model shape
  hf_llama.py compare DIR TOKENS ZERO_LOGITS [TOL]
                                   transformers' logits of DIR vs zero's; fails above TOL
                                   (default 1e-4; 0: bit for bit)
  hf_llama.py make-variants OUT     every VARIANTS model as OUT/NAME, token sequences OUT/tokens.txt
  hf_llama.py compare-all TOKENS TOL DIR ZERO_LOGITS [DIR ZERO_LOGITS ...]
                                   compare for several models in one process (imports once)
  hf_llama.py differ A B MIN       fails unless two logits files differ by more than MIN
  hf_llama.py set-key KEY JSON DIR sets a config.json key
  hf_llama.py drop-tensor NAME DIR removes a tensor from the index
  hf_llama.py serve CALLS CODES     runs the commands above read from the FIFO CALLS, one per
                                   line (arguments tab-separated), and writes each one's exit
                                   code to the FIFO CODES (tests/e2e/lib/hf.sh, hf_helper): a test
                                   imports torch and transformers once instead of once per command
"""
import json
import sys
import traceback

TOL = 1e-4


# torch and transformers are imported where needed: on a loaded machine importing them takes
# tens of seconds, and the config edits need neither.
# The model shapes of the variants test (hf_variants.sh): each RoPE type transformers ships for
# LLaMA, LLaMA's attention_bias, and Qwen2 (q/k/v biases), tied and untied. Lengths are chosen
# so that each rope type changes the frequencies: llama3's smoothing band (wavelengths 16..64)
# holds one of the 8 frequencies of head_dim 16, yarn's ramp spans dims 0..2.
VARIANTS = {
    "llama32": dict(rope_theta=500000.0, tie_word_embeddings=True,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64}),
    "linear": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "dynamic": dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "yarn": dict(rope_theta=10000.0,
                 rope_scaling={"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 32}),
    "llama-bias": dict(attention_bias=True),
    "qwen2": dict(qwen2=True),
    "qwen2-tied": dict(qwen2=True, tie_word_embeddings=True),
    # Mistral: LLaMA's weights under MistralForCausalLM; a null sliding window, and one as long
    # as max_position_embeddings (no sequence reaches it: transformers takes the causal path).
    "mistral": dict(family="mistral", sliding_window=None),
    "mistral-window": dict(family="mistral", sliding_window=128),
}


def make(out, tokens_path, tied=""):
    import torch
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    torch.manual_seed(0)
    if tied in VARIANTS:
        kw = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, rope_theta=50000.0, tie_word_embeddings=False,
                  initializer_range=0.1, bos_token_id=1, eos_token_id=2)
        kw.update(VARIANTS[tied])
        family = "qwen2" if kw.pop("qwen2", False) else kw.pop("family", "llama")
        config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                                 "mistral": (MistralConfig, MistralForCausalLM)}[family]
        cfg = config_cls(**kw)
        model = model_cls(cfg).float()
        with torch.no_grad():  # biases start at 0 and norms at 1: make both matter
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
                elif name.endswith(".bias"):
                    p.uniform_(-0.5, 0.5)
        model.save_pretrained(out, max_shard_size="100KB")
        tokens = torch.randint(0, cfg.vocab_size, (2, 48))
        with open(tokens_path, "w") as f:
            for row in tokens.tolist():
                f.write(" ".join(map(str, row)) + "\n")
        return 0

    # Grouped-query attention, a non-default rope_theta, eps and MLP width, so that every key
    # the loader maps is exercised; initializer_range 0.1 (not 0.02) gives logits of order 1, so
    # the tolerance is a real bound.
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-6, rope_theta=50000.0, tie_word_embeddings=tied == "tied",
                      initializer_range=0.1,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # norms start at 1: make them tell their names apart
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    if tied == "tied":  # what the test relies on: one tensor, and no lm_head in the files
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(out, max_shard_size="100KB")
    tokens = torch.randint(0, cfg.vocab_size, (2, 48))
    with open(tokens_path, "w") as f:
        for row in tokens.tolist():
            f.write(" ".join(map(str, row)) + "\n")


def make_variants(out):
    for name in VARIANTS:
        make(f"{out}/{name}", f"{out}/tokens.txt", name)  # one vocabulary: one token file


def logits_of(model_dir, tokens_path):
    import torch
    from transformers import AutoModelForCausalLM

    rows = [[int(t) for t in line.split()] for line in open(tokens_path) if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(rows)).logits


def compare(model_dir, tokens_path, zero_path, tol=TOL):
    from safetensors.torch import load_file

    theirs = logits_of(model_dir, tokens_path)
    ours = load_file(zero_path)["logits"]
    if ours.shape != theirs.shape:
        print(f"shape: zero {tuple(ours.shape)} vs transformers {tuple(theirs.shape)}")
        return 1
    diff = (ours - theirs).abs().max().item()
    tol = float(tol)
    print(f"max |zero - transformers| logit difference: {diff:.3e} (tolerance {tol:g}, "
          f"logits up to {theirs.abs().max().item():.3f})")
    return 0 if diff <= tol else 1


def compare_all(tokens_path, tol, *pairs):
    failed = []
    for model_dir, zero_path in zip(pairs[::2], pairs[1::2]):
        print(f"{model_dir}: ", end="")
        if compare(model_dir, tokens_path, zero_path, tol):
            failed.append(model_dir)
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


def differ(a, b, least):
    from safetensors.torch import load_file

    diff = (load_file(a)["logits"] - load_file(b)["logits"]).abs().max().item()
    print(f"max logit change: {diff:.3e} (must exceed {least})")
    return 0 if diff > float(least) else 1


def set_key(key, value, model_dir):
    path = f"{model_dir}/config.json"
    cfg = json.load(open(path))
    cfg[key] = json.loads(value)
    json.dump(cfg, open(path, "w"))


def drop_tensor(name, model_dir):
    path = f"{model_dir}/model.safetensors.index.json"
    index = json.load(open(path))
    del index["weight_map"][name]
    json.dump(index, open(path, "w"))


COMMANDS = {"make": make, "compare": compare, "compare-all": compare_all,
            "make-variants": make_variants, "differ": differ, "set-key": set_key,
            "drop-tensor": drop_tensor}


def serve(calls_path, codes_path):
    # Every command seeds what it draws (make: torch.manual_seed(0)) and keeps no state, so a
    # command gives the same result here as in a process of its own.
    with open(calls_path) as calls, open(codes_path, "w") as codes:
        for line in calls:  # ends when the test's shell, the only writer, exits
            cmd, *args = line.rstrip("\n").split("\t")
            try:
                code = COMMANDS[cmd](*args) or 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except Exception:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            codes.write(f"{code}\n")
            codes.flush()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit((serve if cmd == "serve" else COMMANDS[cmd])(*args) or 0)
