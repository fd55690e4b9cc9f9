"""`Elmo`: ELMo for notebooks and scripts: token lists in, one float32 array
[L+1, n_tokens, 2P] per sentence out (a thin, stateful wrapper over `embed`).
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.embedding import embed_token_vectors, encode_tokens
from elmo_jax.model import LSTMState, init_state, packed_segments
from elmo_jax.options import ElmoOptions
from elmo_jax.shapes import bucket, round_up
from elmo_jax.weights import load_weights


class Elmo:
    """Embed token lists from a notebook: `Elmo.from_files(o, w).embed_sentences(s)`.

    Batches are sorted by length and padded to power-of-two lengths and batch
    sizes, so that new inputs rarely trigger a compilation. Each distinct token
    of a batch goes through the character CNN once; with `cache_vocab` (a list
    of words, like bilm-tf's `dump_token_embeddings`) the vectors of those words
    are computed once up front and reused, and other tokens fall back to the
    character CNN. Stateless batches are packed: rows sorted by length, and the
    LSTMs skip the padding of shorter rows (`pack=False` turns this off). With
    `stateful=True` the LSTM state of each batch row is carried from one call to
    the next (bilm-tf's behaviour; sentences are then neither reordered nor
    packed). `dtype` and `unroll` are embed's speed knobs."""

    def __init__(self, params: dict, options: ElmoOptions, stateful: bool = False,
                 min_length_bucket: int = 8, cache_vocab: Sequence[str] | None = None,
                 pack: bool = True, dtype=jnp.float32, unroll: int = 1):
        self.params = jax.device_put(params)
        self.options = options
        self.stateful = stateful
        self.min_length_bucket = min_length_bucket
        self.pack = pack and not stateful
        self.dtype, self.unroll = dtype, unroll
        self.state: LSTMState | None = None
        self._cached: dict[str, int] = {}
        self._cache = np.zeros((0, options.lstm.projection_dim), np.float32)
        if cache_vocab is not None:
            self.cache_tokens(cache_vocab)

    @classmethod
    def from_files(cls, options_json: str | os.PathLike, weights_hdf5: str | os.PathLike,
                   **kwargs) -> "Elmo":
        options = ElmoOptions.from_json(options_json)
        return cls(load_weights(weights_hdf5, options), options, **kwargs)

    @classmethod
    def from_export(cls, path: str | os.PathLike, **kwargs) -> "Elmo":
        """From a stored model (`stored.open_model`): an export folder (`train.py
        export`), a weights file with its options.json beside it, or a training
        workdir."""
        from elmo_jax.stored import open_model

        model = open_model(path)
        return cls(model.params, model.options, **kwargs)

    def reset_state(self) -> None:
        self.state = None

    def cache_tokens(self, words: Sequence[str], chunk: int = 1024) -> None:
        """Precompute and keep the token vectors [len(words), P] of `words`."""
        words = [w for w in dict.fromkeys(words) if w not in self._cached]
        vectors = [self._encode(words[i:i + chunk]) for i in range(0, len(words), chunk)]
        for w in words:
            self._cached[w] = len(self._cached)
        if vectors:
            self._cache = np.concatenate([self._cache] + vectors)

    def token_vectors(self, tokens: Sequence[str]) -> np.ndarray:
        """[n, P] context-independent vectors: cached words from the cache, the
        rest through the character CNN."""
        out = np.zeros((len(tokens), self.options.lstm.projection_dim), np.float32)
        misses = [i for i, t in enumerate(tokens) if t not in self._cached]
        hits = [i for i, t in enumerate(tokens) if t in self._cached]
        if hits:
            out[hits] = self._cache[[self._cached[tokens[i]] for i in hits]]
        if misses:
            out[misses] = self._encode([tokens[i] for i in misses])
        return out

    def _encode(self, tokens: Sequence[str]) -> np.ndarray:
        C = self.options.char_cnn.max_characters_per_token
        ids = np.zeros((bucket(len(tokens), 16), C), np.int32)
        for i, t in enumerate(tokens):
            ids[i] = chars.token_to_char_ids(t, C)
        ids = chars.trim_padding(ids, self.options.char_cnn.widest_filter)
        return np.asarray(encode_tokens(self.params, ids, self.options))[:len(tokens)]

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 64
                        ) -> list[np.ndarray]:
        """One float32 array [L+1, n_tokens, 2P] per sentence, in input order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _check_sentences(sentences)
        order = list(range(len(sentences)))
        if not self.stateful:
            order.sort(key=lambda i: len(sentences[i]))
        result: list[np.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            layers = self._embed_batch([sentences[i] for i in idx])
            for row, i in enumerate(idx):
                result[i] = layers[:, row, :len(sentences[i])]
        return result

    def _embed_batch(self, batch) -> np.ndarray:
        """[L+1, len(batch), T, 2P] for the sentences of one batch, in order."""
        order = list(range(len(batch)))
        lengths = [len(s) for s in batch]
        T = bucket(max(lengths), self.min_length_bucket)
        rows = len(batch) if self.stateful else bucket(len(batch), 1)
        # Pack (longest first, LSTMs skip the padding) only when padding would be
        # much of the work: a length-sorted corpus then reuses a few compiled shapes.
        pack = self.pack and sum(n + 2 for n in lengths) < 0.5 * rows * (T + 2)
        if pack:
            order.sort(key=lambda i: -lengths[i])
            T = round_up(max(lengths) + 2, 8) - 2
            rows = round_up(len(batch), 8)
        distinct = list(dict.fromkeys(t for s in batch for t in s))
        vectors = self.token_vectors(distinct)
        where = {t: i for i, t in enumerate(distinct)}
        tokens = np.zeros((rows, T, self.options.lstm.projection_dim), np.float32)
        mask = np.zeros((rows, T), bool)
        for b, i in enumerate(order):
            s = batch[i]
            if s:
                tokens[b, :len(s)] = vectors[[where[t] for t in s]]
                mask[b, :len(s)] = True
        segments = packed_segments(mask.sum(1) + 2) if pack else None
        state = self._stateful_rows(rows) if self.stateful else None
        out = embed_token_vectors(self.params, tokens, mask, self.options, state,
                                  dtype=self.dtype, unroll=self.unroll, segments=segments)
        if self.stateful:
            self.state = jax.tree.map(lambda full, new: full.at[:, :, :rows].set(new),
                                      self.state, out.state)
        layers = np.asarray(out.layers)
        return layers[:, np.argsort(order)]

    def _stateful_rows(self, rows: int) -> LSTMState:
        """The carried state of the first `rows` rows, growing the store with
        zero rows when a batch is larger than any before it."""
        if self.state is None or self.state.h.shape[2] < rows:
            grown = init_state(self.options, rows)
            if self.state is not None:
                n = self.state.h.shape[2]
                grown = jax.tree.map(lambda g, s: g.at[:, :, :n].set(s), grown, self.state)
            self.state = grown
        return jax.tree.map(lambda s: s[:, :, :rows], self.state)


def _check_sentences(sentences) -> None:
    """The errors `batch_to_char_ids` gives, without building the char ids."""
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError("embed_sentences takes a list of sentences, each a list of token strings")
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise TypeError(f"sentence {i} is a str, not a list of tokens: split it first")
        for j, t in enumerate(s):
            if not isinstance(t, str) or not t:
                raise (TypeError if not isinstance(t, str) else ValueError)(
                    f"sentence {i}, token {j}: a token must be a non-empty str, got {t!r}")
