"""Writes Megatron indexed datasets with megatron-core's own IndexedDatasetBuilder
(tests/e2e/megatron_data.sh).

  megatron_data.py OUT DTYPE...  for each DTYPE (uint16, int32) in OUT/DTYPE/: corpus.{bin,idx}
                               in numpy DTYPE: 300 random documents, some split into several
                               sequences (as preprocess_data.py --split-sentences does);
                               documents.txt, every document's tokens one per line, as
                               megatron-core's IndexedDataset reads them back; flat.bin, the same
                               tokens back to back as headerless uint16 (zero's bin: source), for
                               the training comparison. Exit code 77 when megatron-core (its
                               indexed_dataset module) cannot be imported.
One process for every dtype: importing megatron-core takes seconds.
"""
import os
import sys

try:
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
except ImportError as e:
    print(f"megatron-core cannot be imported: {e}")
    sys.exit(77)


def main(out, dtype):
    rng = numpy.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{out}/corpus.bin", dtype=getattr(numpy, dtype))
    for _ in range(300):
        parts = rng.integers(1, 4)
        for _ in range(parts):
            n = int(rng.integers(1, 60))
            builder.add_item(torch.from_numpy(rng.integers(0, 256, n)))
        builder.end_document()
    builder.finalize(f"{out}/corpus.idx")

    # megatron-core's reader gives the expected tokens: each document's sequences in order.
    ds = IndexedDataset(f"{out}/corpus")
    docs = ds.document_indices
    flat = []
    with open(f"{out}/documents.txt", "w") as f:
        for d in range(len(docs) - 1):
            tokens = [int(t) for s in range(docs[d], docs[d + 1]) for t in ds[s]]
            flat += tokens
            f.write(" ".join(map(str, tokens)) + "\n")
    numpy.array(flat, dtype=numpy.uint16).tofile(f"{out}/flat.bin")
    print(f"megatron-core wrote {len(flat)} tokens in {len(docs) - 1} documents, "
          f"{len(ds)} sequences, dtype {ds.index.dtype.__name__}")


if __name__ == "__main__":
    for dtype in sys.argv[2:]:
        os.makedirs(f"{sys.argv[1]}/{dtype}", exist_ok=True)
        main(f"{sys.argv[1]}/{dtype}", dtype)
