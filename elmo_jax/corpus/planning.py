"""Batch planning: a chunk's lines as pieces (a line, or a window of one
longer than max_length), sorted by length and packed into a few fixed
(rows, length) shapes; each batch spelled as character ids."""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from elmo_jax.core import chars
from elmo_jax.corpus.reading import Chunk
from elmo_jax.data.sources import DataError
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.batching import round_up, windows


class Piece(NamedTuple):
    line: int       # within the chunk
    start: int      # the window's first token in the line
    end: int
    keep: tuple     # (lo, hi) within the window: the tokens it gives the line
    part: int       # which window of the line, and how many it has
    parts: int


def batch_shapes(batch_tokens: int, max_length: int, row_multiple: int,
                 max_rows: int | None = None) -> list[tuple[int, int]]:
    """[(rows, length)], lengths 16, 32, ... up to max_length (rounded up to
    8), rows about batch_tokens / length in multiples of `row_multiple`."""
    lengths, T = [], 16
    while T < max_length:
        lengths.append(T)
        T *= 2
    lengths.append(round_up(max_length, 8))
    shapes = []
    for T in lengths:
        rows = max(row_multiple, (batch_tokens // T) // row_multiple * row_multiple)
        if max_rows:
            rows = min(rows, round_up(max_rows, row_multiple))
        shapes.append((rows, T))
    return shapes


def pieces_of(chunk: Chunk, max_length: int) -> list[Piece]:
    out = []
    for i, tokens in enumerate(chunk.tokens):
        if not tokens:
            continue
        spans = windows(len(tokens), max_length)
        for k, (a, b, ka, kb) in enumerate(spans):
            out.append(Piece(i, a, b, (ka - a, kb - a), k, len(spans)))
    return out


def plan_batches(pieces: Sequence[Piece], shapes) -> list[tuple[tuple, list[Piece]]]:
    """[(shape, pieces)]: pieces sorted by length (stably), each batch the
    next pieces that fit the smallest length that holds the first of them."""
    order = sorted(pieces, key=lambda p: p.end - p.start)
    batches, i = [], 0
    while i < len(order):
        n = order[i].end - order[i].start
        rows, T = next(s for s in shapes if s[1] >= n)
        j = i
        while j < len(order) and j - i < rows and order[j].end - order[j].start <= T:
            j += 1
        batches.append(((rows, T), order[i:j]))
        i = j
    return batches


class Speller:
    """Token -> its ids row, memoised (a corpus repeats its words)."""

    def __init__(self, options: ElmoOptions, lexicon=None, max_cached: int = 1 << 18):
        self.C = options.char_cnn.max_characters_per_token
        self.width = options.char_cnn.ids_per_token
        self.lexicon, self.max_cached, self.cache = lexicon, max_cached, {}

    def spell(self, token: str) -> np.ndarray:
        ids = self.cache.get(token)
        if ids is None:
            ids = (self.lexicon.token_ids(token, self.C) if self.lexicon is not None
                   else chars.token_to_char_ids(token, self.C)).astype(np.int16)
            if len(self.cache) >= self.max_cached:
                self.cache.clear()
            self.cache[token] = ids
        return ids

    def batch(self, chunk: Chunk, pieces: Sequence[Piece], shape) -> dict:
        rows, T = shape
        ids = np.zeros((rows, T, self.width), np.int16)
        lo = np.zeros(rows, np.int32)
        hi = np.zeros(rows, np.int32)
        for b, p in enumerate(pieces):
            toks = chunk.tokens[p.line][p.start:p.end]
            try:
                ids[b, :len(toks)] = [self.spell(t) for t in toks]
            except ValueError as e:
                raise DataError(f"line {chunk.first_line + p.line}: {e}") from None
            lo[b], hi[b] = p.keep
        return {"char_ids": ids, "keep_lo": lo, "keep_hi": hi}
