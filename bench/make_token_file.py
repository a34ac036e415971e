#!/usr/bin/env python3
"""A token file of real text for the convergence benchmarks (bench/compress.py --data), made from
what every Debian machine with Python has: the sources of Python's standard library (English
docstrings and comments around code). No download.

  python3 bench/make_token_file.py --mb 4 --vocab 256  --out /tmp/pystd_256.bin
  python3 bench/make_token_file.py --mb 4 --vocab 8192 --out /tmp/pystd_8192.bin

--vocab 256: one token per byte (the `small` preset's vocabulary). A larger vocab: a byte-level
BPE tokenizer trained on the same text with the `tokenizers` package (gpt-25m's 8192). Written
as nanoGPT's .bin (uint16 tokens, little-endian), which zero-train reads as trainer.data=bin:PATH.
"""
import argparse
import glob
import os
import sys
import sysconfig

import numpy as np


def collect(mb):
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True))
    # Tests and generated tables are mostly data, not prose or idiomatic code.
    files = [f for f in files if "/test" not in f and "/idlelib/" not in f and "_data" not in f]
    out, size = [], 0
    for f in files:
        try:
            t = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        size += len(t.encode("utf-8"))
        if size >= mb * 2**20:
            break
    return out, size, stdlib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    texts, size, where = collect(args.mb)
    if args.vocab == 256:
        ids = np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    else:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer)
        ids = np.concatenate([np.array(e.ids, dtype=np.uint16)
                              for e in tok.encode_batch(texts)])
    assert ids.max() < args.vocab
    ids.tofile(args.out)
    print(f"{args.out}: {ids.size} tokens (vocab {args.vocab}) from {len(texts)} files, "
          f"{size / 2**20:.1f} MiB of {where}/**/*.py", file=sys.stderr)


if __name__ == "__main__":
    main()
