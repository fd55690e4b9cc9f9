"""The host input pipeline's speed: tokens/s of training batches that one
process makes for the devices it feeds (`data.StreamBatcher`: windows, token
tables and character ids by array slicing over a `TokenCorpus`), in the
process or with input worker processes, against what one host must feed.

    python -m bench.host_input [--config original] [--groups 8] [--seconds 20]
                               [--workers N] [--prepared]

`--prepared` reads the corpus from a folder `train.py prepare` wrote
(memory-mapped) instead of preparing it in memory. Corpus: the bilm-tf peer's
KJV Bible when it is set up, else a synthetic one (Zipfian words over a
100,000-word vocabulary, so that token tables and the spelling table see a
realistic spread of distinct words).
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="original")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--groups", type=int, default=8, help="devices fed by this host")
    ap.add_argument("--workers", type=int, default=0,
                    help="input worker processes (train.input_workers); 0: in the process")
    ap.add_argument("--prepared", action="store_true",
                    help="read a prepared folder (memory-mapped) instead of text")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    from elmo_jax.data import (ParallelStreamBatcher, StreamBatcher, TokenCorpus, prepare,
                               vocab_from_files)

    options = _common.load_config(args.config).model
    kjv = os.path.join(_common.PEERS_HOME, "bilm-tf-data", "train.txt")
    tmp = tempfile.mkdtemp()
    corpus_file = kjv if os.path.exists(kjv) else os.path.join(tmp, "corpus.txt")
    if corpus_file != kjv:
        synthetic_corpus(corpus_file)
    vocab = vocab_from_files(corpus_file, max_vocab=100_000)[0]
    t0 = time.perf_counter()
    if args.prepared:
        prepare(corpus_file, os.path.join(tmp, "prepared"))
        corpus = TokenCorpus.load(os.path.join(tmp, "prepared"))
    else:
        corpus = TokenCorpus.from_files(corpus_file)
    prepare_s = time.perf_counter() - t0
    batch = options.batch_size * args.groups  # 128 rows per device, as in the plan
    batcher = StreamBatcher(corpus, vocab, batch, options.unroll_steps,
                            options.char_cnn.max_characters_per_token, n_groups=args.groups,
                            widest_filter=options.char_cnn.widest_filter)
    if args.workers:
        batcher = ParallelStreamBatcher(batcher, args.workers)
    for _ in range(3):  # starts the workers, touches the arrays
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
              "corpus": "kjv" if corpus_file == kjv else "synthetic zipf",
              "prepared": args.prepared, "sentences": len(corpus),
              "prepare_s": round(prepare_s, 2), "rows": batch, "groups": args.groups,
              "table_shapes": [list(s) for s in batcher.shapes.all()], "batches": n,
              "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds),
              **_common.machine()}
    _common.write_json(args.json_out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
