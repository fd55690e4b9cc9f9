"""The writer's side: each batch's results gathered into the chunk in flight
(a long line's windows joined, sentence vectors summed), and a complete
chunk published to the shard (`shard_writers.py`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from elmo_jax.corpus.planning import Piece
from elmo_jax.corpus.reading import Chunk
from elmo_jax.corpus.shard_writers import ShardWriter


class ChunkState:
    """What the writer has of the chunk in flight: its lines' starts (rows
    within the chunk), the windows of long lines waiting for their others,
    and with sentence vectors the running sums."""

    def __init__(self, chunk: Chunk, row_shape, sentence_vectors: bool):
        self.chunk = chunk
        n = len(chunk.tokens)
        self.lengths = np.array([len(t) for t in chunk.tokens], np.int64)
        self.todo = int(np.count_nonzero(self.lengths))
        self.starts = np.full(n, -1, np.int64)
        self.rows = 0
        self.parts: dict[int, dict] = {}
        self.sums = np.zeros((n,) + tuple(row_shape), np.float32) if sentence_vectors else None
        self._bytes_left = sum(chunk.line_bytes)
        self._bytes_done = 0

    @property
    def complete(self) -> bool:
        return self.todo == 0

    def take_bytes(self) -> int:
        """The input bytes finished since the last call (the rest of the
        chunk's, blank lines too, once it is complete)."""
        b = self._bytes_left if self.complete else min(self._bytes_done, self._bytes_left)
        self._bytes_left -= b
        self._bytes_done = 0
        return b

    def add(self, pieces: Sequence[Piece], out: np.ndarray, writer: ShardWriter) -> int:
        """Take one batch's results; returns the tokens it finished."""
        rows, tokens = [], 0
        for b, p in enumerate(pieces):
            lo, hi = p.keep
            if self.sums is not None:
                self.sums[p.line] += out[b]
                part = None
            else:
                part = out[b, lo:hi]
            if p.parts > 1:
                got = self.parts.setdefault(p.line, {})
                got[p.part] = part
                if len(got) < p.parts:
                    continue
                part = (None if part is None
                        else np.concatenate([got[k] for k in range(p.parts)]))
                del self.parts[p.line]
            self.todo -= 1
            tokens += int(self.lengths[p.line])
            self._bytes_done += self.chunk.line_bytes[p.line]
            if part is not None:
                self.starts[p.line] = self.rows
                self.rows += len(part)
                rows.append(part)
        if rows:
            writer.append_rows(np.concatenate(rows))
        return tokens


def publish(writer: ShardWriter, state: ChunkState, store_dtype: np.dtype, bar) -> None:
    """Write a complete chunk's line starts and lengths (with sentence
    vectors its lines' means first), then its marker."""
    base = writer.rows
    n = len(state.lengths)
    if state.sums is not None:
        means = state.sums / np.maximum(state.lengths, 1).reshape((-1,) + (1,) * (
            state.sums.ndim - 1))
        writer.append_rows(means.astype(store_dtype))
        starts, rows = base + np.arange(n), n
    else:
        empty = state.starts < 0
        state.starts[empty] = state.rows  # a line of no tokens: no rows
        starts, rows = base + state.starts, state.rows
    writer.finish_chunk(state.chunk.index, starts, state.lengths, rows, state.chunk.skipped,
                        tokens=int(state.lengths.sum()))
    bar.update(state.take_bytes())
