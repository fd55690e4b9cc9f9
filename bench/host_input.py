"""The host input pipeline's speed: tokens/s that one process's `data.Batcher`
turns from text into training batches (reading, shuffling, windows, token
tables and character ids), against what one host must feed by the plan.

    python -m bench.host_input [--config original] [--seconds 20]

Corpus: the bilm-tf peer's KJV Bible when it is set up, else a synthetic one
(Zipfian words over a 100,000-word vocabulary, so that token tables and the
character-id cache see a realistic spread of distinct words).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from bench import _common


def synthetic_corpus(path: str, sentences: int = 200_000, vocab: int = 100_000) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    words = [f"w{i}x" for i in range(vocab)]
    lengths = rng.integers(5, 45, sentences)
    ids = np.minimum(rng.zipf(1.2, int(lengths.sum())), vocab) - 1
    with open(path, "w", encoding="utf-8") as fh:
        pos = 0
        for n in lengths:
            fh.write(" ".join(words[i] for i in ids[pos:pos + n]) + "\n")
            pos += n


def split_corpus(path: str, n: int, out_dir: str) -> str:
    """The corpus as n shards (a worker reads its own shards); returns their glob."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    for i in range(n):
        with open(os.path.join(out_dir, f"shard-{i}.txt"), "w", encoding="utf-8") as fh:
            fh.writelines(lines[i::n])
    return os.path.join(out_dir, "shard-*.txt")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="original")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--groups", type=int, default=8, help="devices fed by this host")
    ap.add_argument("--workers", type=int, default=0,
                    help="input worker processes (train.input_workers); 0: in the process")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    from elmo_jax.data import Batcher, ParallelBatcher, TextSource, vocab_from_files

    options = _common.load_config(args.config).model
    kjv = os.path.join(_common.PEERS_HOME, "bilm-tf-data", "train.txt")
    tmp = tempfile.mkdtemp()
    corpus = kjv if os.path.exists(kjv) else os.path.join(tmp, "corpus.txt")
    if corpus != kjv:
        synthetic_corpus(corpus)
    vocab = vocab_from_files(corpus, max_vocab=100_000)[0]
    batch = options.batch_size * args.groups  # 128 rows per device, as in the plan
    C = options.char_cnn.max_characters_per_token
    if args.workers:
        shards = split_corpus(corpus, args.workers, tmp)
        batcher = ParallelBatcher(shards, vocab, batch, options.unroll_steps, C,
                                  n_groups=args.groups, workers=args.workers,
                                  widest_filter=options.char_cnn.widest_filter)
    else:
        batcher = Batcher(TextSource(corpus, seed=0), vocab, batch, options.unroll_steps, C,
                          n_groups=args.groups, widest_filter=options.char_cnn.widest_filter)
    for _ in range(3):  # loads the shards (and starts the workers)
        next(batcher)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        next(batcher)
        n += 1
    seconds = time.perf_counter() - t0
    tokens = n * batch * options.unroll_steps
    if args.workers:
        batcher.close()
    result = {"benchmark": "host_input", "config": args.config, "workers": args.workers,
              "corpus": "kjv" if corpus == kjv else "synthetic zipf", "rows": batch,
              "groups": args.groups, "batches": n, "seconds": round(seconds, 2),
              "tokens_per_s": round(tokens / seconds), **_common.machine()}
    _common.write_json(args.json_out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
