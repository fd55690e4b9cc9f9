"""bilm-tf's `_get_batch` windows over any sentences, in plain Python: the
tests' reference for `data.StreamBatcher`'s batches (the batch layout is in
`elmo_jax/data/streams.py`'s docstring).

The batcher keeps `B` parallel streams: each row takes the next sentence
when its current one is used up, so the LSTM state of a row carries meaning
from one window of `unroll_steps` to the next. A sentence of n words gives
n + 1 positions: the inputs are the sequence without its last token and the
targets are the sequence without its first.
"""
from __future__ import annotations

import numpy as np

from elmo_jax.core.chars import MAX_CHARS, PAD_CHAR, token_to_char_ids, trim_padding
from elmo_jax.data import DataError
from elmo_jax.core.batching import round_up
from elmo_jax.core.vocab import BOS, EOS, Vocabulary


class CharIdCache:
    """token -> [C] char ids, computed once per distinct token."""

    def __init__(self, max_chars: int = MAX_CHARS, max_entries: int = 2_000_000):
        self.max_chars, self.max_entries = max_chars, max_entries
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, token: str) -> np.ndarray:
        ids = self._cache.get(token)
        if ids is None:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            ids = self._cache[token] = token_to_char_ids(token, self.max_chars)
        return ids


class Batcher:
    """B parallel streams of sentences cut into windows of `unroll_steps`.

    `source` is an iterable of sentences, read once (evaluation; training
    reads `streams.StreamBatcher`'s batches): row i takes the next sentence
    when its own is used up, the last windows are padded and `mask` marks the
    real positions; iteration stops when every row is empty. `widest_filter`
    (the model's, when > 0) cuts each batch's token spellings to the
    characters its CNN needs."""

    def __init__(self, source, vocab: Vocabulary, batch_size: int, unroll_steps: int,
                 max_chars: int = MAX_CHARS, n_groups: int = 1, table_bucket: int = 128,
                 widest_filter: int = 0):
        if batch_size % n_groups:
            raise DataError(f"batch size {batch_size} does not split into {n_groups} groups")
        self.source, self.vocab = source, vocab
        self.B, self.U, self.C = batch_size, unroll_steps, max_chars
        self.S, self.table_bucket, self.widest_filter = n_groups, table_bucket, widest_filter
        self.chars = CharIdCache(max_chars)
        self.rows: list[list[str]] = [[] for _ in range(batch_size)]  # current sentence, forward
        self.offsets = [0] * batch_size
        self._once = iter(source)

    def _next_sentence(self) -> list[str] | None:
        return next(self._once, None)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        B, U = self.B, self.U
        tokens = [[[None] * U for _ in range(B)] for _ in range(2)]
        targets = np.zeros((2, B, U), np.int32)
        mask = np.zeros((B, U), bool)
        for i in range(B):
            t = 0
            while t < U:
                if len(self.rows[i]) - self.offsets[i] <= 1:
                    sentence = self._next_sentence()
                    if sentence is None:
                        self.rows[i], self.offsets[i] = [], 0
                        break
                    self.rows[i], self.offsets[i] = [BOS] + sentence + [EOS], 0
                seq, off = self.rows[i], self.offsets[i]
                n = min(len(seq) - off - 1, U - t)
                for d, reading in enumerate((seq, seq[::-1])):
                    tokens[d][i][t:t + n] = reading[off:off + n]
                    targets[d, i, t:t + n] = self.vocab.encode(reading[off + 1:off + n + 1])
                mask[i, t:t + n] = True
                self.offsets[i] += n
                t += n
        if not mask.any():
            raise StopIteration
        token_chars, token_index = self._token_tables(tokens, mask)
        return {"token_chars": token_chars, "token_index": token_index,
                "targets": targets, "mask": mask}

    def _token_tables(self, tokens, mask):
        B, U, S = self.B, self.U, self.S
        rows = B // S
        index = np.zeros((2, B, U), np.int32)
        tables = []
        for s in range(S):
            table: dict[str, int] = {}
            for d in range(2):
                for i in range(s * rows, (s + 1) * rows):
                    for t in range(U):
                        if mask[i, t]:
                            index[d, i, t] = table.setdefault(tokens[d][i][t], len(table) + 1)
            tables.append(table)
        n = max(len(t) for t in tables) + 1
        n = round_up(n, self.table_bucket)  # few shapes, few compilations
        token_chars = np.zeros((S, n, self.C), np.int32)
        for s, table in enumerate(tables):
            for token, k in table.items():
                token_chars[s, k] = self.chars(token)
        if self.widest_filter:
            token_chars = trim_padding(token_chars, self.widest_filter)
        return token_chars, index


def pad_tables(batch: dict, n: int, width: int | None = None) -> dict:
    """A batch's token tables padded to n rows (all-zero padding tokens) and
    `width` characters (the padding id after each real token's spelling)."""
    chars = batch["token_chars"]
    (S, n0, w0), width = chars.shape, width or chars.shape[2]
    if (n0, w0) == (n, width):
        return batch
    padded = np.zeros((S, n, width), chars.dtype)
    padded[:, :n0, w0:] = np.where(np.any(chars > 0, axis=-1, keepdims=True), PAD_CHAR + 1, 0)
    padded[:, :n0, :w0] = chars
    return {**batch, "token_chars": padded}
