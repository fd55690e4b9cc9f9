"""The add-one (Laplace) unigram language model: the floor a biLM's held-out
perplexity must beat. It predicts what the biLM's evaluation predicts: each
sentence's words and one boundary (`</S>` forward, `<S>` backward: both occur
once a sentence, so the two directions' perplexities are equal), over the
biLM's vocabulary, unknown words as `<UNK>`."""
from __future__ import annotations

import math

import numpy as np

from elmo_jax.data.sources import list_shards, read_sentences
from elmo_jax.core.vocab import Vocabulary


def unigram_perplexity(train_files: str, vocab: Vocabulary, eval_files: str) -> dict:
    """{"ppl", "predictions"} of the add-one unigram model of `train_files`
    (a glob) on `eval_files` (a glob)."""
    counts = np.zeros(len(vocab), np.int64)
    for path in list_shards(train_files):
        for s in read_sentences(path):
            np.add.at(counts, vocab.encode(s), 1)
            counts[vocab.eos] += 1
    logp = np.log((counts + 1) / (counts.sum() + len(vocab)))
    total, n = 0.0, 0
    for path in list_shards(eval_files):
        for s in read_sentences(path):
            total += float(logp[vocab.encode(s)].sum() + logp[vocab.eos])
            n += len(s) + 1
    return {"ppl": math.exp(-total / n), "predictions": n}
