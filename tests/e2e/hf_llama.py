"""transformers' side of the Hugging Face round-trip test (tests/e2e/hf_llama_roundtrip.sh).

  hf_llama.py make DIR TOKENS [tied]
                                   a tiny random LlamaForCausalLM saved with save_pretrained
                                   (sharded), and token sequences for it; "tied": with
                                   tie_word_embeddings (lm_head is the embedding, not saved)
  hf_llama.py compare DIR TOKENS ZERO_LOGITS [TOL]
                                   transformers' logits of DIR vs zero's; fails above TOL
                                   (default 1e-4; 0: bit for bit)
  hf_llama.py differ A B MIN       fails unless two logits files differ by more than MIN
  hf_llama.py set-key KEY JSON DIR sets a config.json key
  hf_llama.py drop-tensor NAME DIR removes a tensor from the index
"""
import json
import sys

TOL = 1e-4


# torch and transformers are imported where needed: on a loaded machine importing them takes
# tens of seconds, and the config edits need neither.
def make(out, tokens_path, tied=""):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
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


def logits_of(model_dir, tokens_path):
    import torch
    from transformers import LlamaForCausalLM

    rows = [[int(t) for t in line.split()] for line in open(tokens_path) if line.strip()]
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
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


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({"make": make, "compare": compare, "differ": differ, "set-key": set_key,
              "drop-tensor": drop_tensor}[cmd](*args) or 0)
