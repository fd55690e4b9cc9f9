"""A biLM is a language model: each sentence's log-probability under the
forward and the backward LM, with the full softmax.

A sentence w1 .. wn is read as bilm-tf reads it in training and evaluation:
the forward LM reads `<S> w1 .. wn` and predicts `w1 .. wn </S>`, the backward
LM reads `</S> wn .. w1` and predicts `wn .. w1 <S>`; n + 1 predictions each.
Stateless by default (every sentence starts from a zero state, so a sentence
always gets the same score); `stateful=True` reads the sentences in order as
one stream with the state carried, as `train.py eval` does (with one stream,
the scores then add up exactly to its perplexity).
"""
from __future__ import annotations

import functools
import json
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core.chars import batch_to_char_ids, trim_padding
from elmo_jax.errors import MissingFile
from elmo_jax.core.batching import next_power_of_two
from elmo_jax.core.bilm import BiLM, LSTMState, init_state
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.softmax import full_softmax_loss
from elmo_jax.core.vocab import BOS, EOS, Vocabulary


def sentence_readings(sentences: Sequence[Sequence[str]], vocab: Vocabulary, max_chars: int,
                      length: int | None = None, rows: int | None = None):
    """The two readings of each sentence as one batch:
    (char ids [2, B, T, C], targets [2, B, T], mask [B, T]); T >= n + 1."""
    B = rows or len(sentences)
    T = length or max(len(s) for s in sentences) + 1
    fwd = [[BOS] + list(s) for s in sentences] + [[]] * (B - len(sentences))
    bwd = [[EOS] + list(s)[::-1] for s in sentences] + [[]] * (B - len(sentences))
    char_ids = np.stack([batch_to_char_ids(r, max_chars, min_length=T) for r in (fwd, bwd)])
    targets = np.zeros((2, B, T), np.int32)
    mask = np.zeros((B, T), bool)
    for b, s in enumerate(sentences):
        targets[0, b, :len(s) + 1] = vocab.encode(list(s) + [EOS])
        targets[1, b, :len(s) + 1] = vocab.encode(list(s)[::-1] + [BOS])
        mask[b, :len(s) + 1] = True
    return char_ids, targets, mask


@functools.partial(jax.jit, static_argnames=("options",))
def sentence_log_probs(params: dict, softmax: dict, char_ids: jax.Array, targets: jax.Array,
                       mask: jax.Array, state: LSTMState, options: ElmoOptions):
    """-> (log-probability of each row under each direction [2, B], new LSTMState)."""
    outs, new_state = BiLM(options).apply({"params": params}, char_ids, mask, state)
    top = outs[-1]                                                   # [2, B, T, P]
    P = top.shape[-1]
    nll = jax.vmap(lambda h, y: full_softmax_loss(softmax["w"], softmax["b"], h, y))(
        top.reshape(2, -1, P), targets.reshape(2, -1)).reshape(targets.shape)
    return -jnp.sum(nll * mask[None], axis=-1), new_state


def _record(tokens: int, forward: float, backward: float) -> dict:
    n = tokens + 1
    return {"tokens": tokens, "forward_logprob": forward, "backward_logprob": backward,
            "logprob": 0.5 * (forward + backward),
            "forward_ppl": math.exp(-forward / n), "backward_ppl": math.exp(-backward / n),
            "ppl": math.exp(-0.5 * (forward + backward) / n)}


def score_sentences(params: dict, softmax: dict, options: ElmoOptions, vocab: Vocabulary,
                    sentences: Sequence[Sequence[str]], batch_size: int = 32,
                    stateful: bool = False) -> list[dict]:
    """Each sentence's log-probability under the biLM (the full softmax).

    Args:
        params: the biLM's parameters.
        softmax: {"w": [V, P], "b": [V]}, the model's softmax.
        options: the model's `ElmoOptions`.
        vocab: the softmax's `Vocabulary` (V words; others are <UNK>).
        sentences: token lists.
        batch_size: sentences per batch (stateless).
        stateful: carry the LSTM state from one sentence to the next (a
            document, as bilm-tf trains), one sentence at a time.

    Returns:
        One dict per sentence, in order: tokens, forward_logprob,
        backward_logprob, logprob (their mean; natural log), and the
        perplexities forward_ppl, backward_ppl, ppl (per prediction: tokens
        + 1 of them).

    Raises:
        ValueError: a softmax whose rows do not match the vocabulary.
    """
    if softmax["w"].shape[0] != len(vocab):
        raise ValueError(f"the softmax has {softmax['w'].shape[0]} rows, the vocabulary "
                         f"{len(vocab)} words")
    C = options.char_cnn.max_characters_per_token
    softmax = jax.tree.map(jnp.asarray, softmax)
    params = jax.tree.map(jnp.asarray, params)
    out: list[dict] = []
    step = 1 if stateful else batch_size
    state = init_state(options, 1)
    for start in range(0, len(sentences), step):
        part = sentences[start:start + step]
        T = next_power_of_two(max(len(s) for s in part) + 1)
        rows = len(part) if stateful else next_power_of_two(len(part), 1)
        ids, targets, mask = sentence_readings(part, vocab, C, T, rows)
        ids = trim_padding(ids, options.char_cnn.widest_filter)  # same scores, less CNN work
        logp, new_state = sentence_log_probs(
            params, softmax, ids, targets, mask,
            state if stateful else init_state(options, rows), options)
        if stateful:
            state = new_state
        logp = np.asarray(logp, np.float64)
        out += [_record(len(s), float(logp[0, i]), float(logp[1, i])) for i, s in enumerate(part)]
    return out


def load_language_model(path: str) -> tuple[ElmoOptions, dict, dict, Vocabulary]:
    """(options, biLM params, softmax, vocabulary) of an export folder (with
    softmax.hdf5 and vocab.txt) or of a training workdir's newest checkpoint."""
    from elmo_jax.formats.export import SOFTMAX_FILE
    from elmo_jax.formats.stored_model import open_model

    model = open_model(path, softmax=True)
    if model.lexicon is not None:
        raise ValueError(f"{path} spells tokens with a lexicon (ELMoForManyLangs); scoring "
                         "reads models that spell UTF-8 bytes")
    if model.softmax is None:
        raise MissingFile(f"{path} has no {SOFTMAX_FILE} and vocab.txt: scoring needs the "
                                "softmax (exports from `train.py export` have it; bilm-tf's "
                                "dumped weights do not)")
    return model.options, model.params, model.softmax, model.vocab


def corpus_perplexity(records: Sequence[dict]) -> dict:
    """Perplexities of all the scored sentences together, computed as
    `train.py eval` does (bilm-tf's number: exp of the mean of the two
    directions' mean losses)."""
    n = sum(r["tokens"] + 1 for r in records)
    f = -sum(r["forward_logprob"] for r in records) / n
    b = -sum(r["backward_logprob"] for r in records) / n
    return {"ppl_forward": math.exp(f), "ppl_backward": math.exp(b),
            "ppl": math.exp(0.5 * (f + b)), "predictions": n}


def score_file(model: str, input_file: str, output_file: str, batch_size: int = 32,
               stateful: bool = False, tokenize: str | None = None) -> dict:
    """Score each line of `input_file` (line i -> JSON line i, blank lines
    included); returns a summary with the corpus perplexities."""
    from elmo_jax.data import read_sentences
    from elmo_jax.storage.files import write_text

    options, params, softmax, vocab = load_language_model(model)
    sentences = read_sentences(input_file, keep_empty=True)
    if tokenize:
        from elmo_jax.data.segmentation import tokenize_lines

        sentences = tokenize_lines([" ".join(s) for s in sentences], tokenize)
    records = score_sentences(params, softmax, options, vocab, sentences, batch_size, stateful)
    write_text(output_file, "".join(json.dumps({"line": i, **r}) + "\n"
                                    for i, r in enumerate(records)))
    summary = corpus_perplexity(records) if records else {}
    return {"output": output_file, "sentences": len(records), **summary}
