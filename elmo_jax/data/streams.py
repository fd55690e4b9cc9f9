"""Training batches as array slicing: a corpus of token ids, B row streams
in one seeded global order, token tables by `np.unique`, a few fixed shapes.

The corpus (`tokens.TokenCorpus`) is every sentence as spelling ids, `<S> w1
.. wn </S>` one after another; a batch's character ids are a gather from one
table of every spelling.

Streams (`StreamBatcher`): each epoch reads every sentence once in a seeded
permutation; the epochs' orders one after another are one global sequence of
sentences, and row r of the B rows reads items r, r + B, r + 2B, ... of it.
A row's stream depends on nothing but r, B and the seed, so where a run is
in its data is one number per row (`cursors`: the row's next item and the
offset in it) plus the batches made: a checkpoint of any number of processes
resumes on any other number, reading exactly the text an uninterrupted run
reads. The windows are bilm-tf's (`tests/bilm_batcher.py` makes them as
bilm-tf does, the tests' reference): a sentence of n words gives
n + 1 positions; forward reads `<S> w1 .. wn`, predicting `w1 .. </S>`, and
backward reads `</S> wn .. w1`, predicting `wn .. <S>`, position by position
alongside.

Shapes (`TableShapes`): a batch's token tables have one of at most two row
counts and two character widths, fixed before training (at most 4 train
programs, all compiled before step 1): the small ones cover the batches of a
sample with a margin, the large ones every batch there can be.

A batch is a dict of numpy arrays:
    token_chars [S, N, C] int32  the distinct tokens of each of S row groups
                                 (one per data-parallel shard), spelled as char
                                 ids; row 0 is the all-zero padding token. With
                                 `widest_filter`, C is cut to what the character
                                 CNN needs (`chars.trim_padding`): same outputs
    token_index [2, B, U] int32  forward and backward readings: which row of
                                 its group's table each position holds
    targets     [2, B, U] int32  the next token of each reading (vocabulary ids)
    mask        [B, U]    bool   False only where an evaluation stream ran dry

Both readings of a window, and neighbouring windows, repeat the same words;
encoding each distinct token once makes the character CNN 2-3 times cheaper.
Rows b of group s are s * B/S .. (s + 1) * B/S - 1.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from elmo_jax.core.chars import BOW_CHAR, EOW_CHAR, PAD_CHAR, token_to_char_ids
from elmo_jax.data.sources import DataError
from elmo_jax.data.tokens import PAD_ID, TokenCorpus
from elmo_jax.core.batching import round_up
from elmo_jax.core.vocab import BOS, EOS, Vocabulary

def spell_all(spellings: list[str], max_chars: int) -> np.ndarray:
    """[K, C] uint16: `chars.token_to_char_ids` of every spelling at once (row
    0, the padding spelling "", all zeros): a corpus of millions of spellings
    is spelled in a second or two, not a Python call each."""
    try:
        encoded = [w.encode("utf-8")[:max_chars - 2] for w in spellings]
    except UnicodeEncodeError:
        for w in spellings:
            try:
                w.encode("utf-8")
            except UnicodeEncodeError:
                raise DataError(f"token {w!r} is not valid Unicode text (it cannot be written "
                                "as UTF-8); decode input files as UTF-8 with errors='strict'"
                                ) from None
        raise
    lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
    flat = np.frombuffer(b"".join(encoded), np.uint8)
    out = np.full((len(spellings), max_chars), PAD_CHAR + 1, np.uint16)
    out[:, 0] = BOW_CHAR + 1
    rows = np.repeat(np.arange(len(spellings)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
    out[rows, cols] = flat.astype(np.uint16) + 1
    out[np.arange(len(spellings)), lengths + 1] = EOW_CHAR + 1
    for i, w in enumerate(spellings):
        if w in (BOS, EOS):  # the sentence boundaries' own spellings
            out[i] = token_to_char_ids(w, max_chars)
    out[[i for i, w in enumerate(spellings) if not w]] = 0
    return out


@dataclasses.dataclass(frozen=True)
class SpellingTables:
    """Per spelling: its character ids `chars` [K, C] (uint16), the `width`
    [K] the character CNN needs of it (`chars.trim_padding`'s L + widest
    filter), and its vocabulary id `vocab_ids` [K]. With a `lexicon`
    (ELMoForManyLangs' spelling, `lexicon.py`) the ids are the lexicon's
    [K, C (+1: the word id)] int32, never cut (`max_chars` is then that width)."""
    chars: np.ndarray
    width: np.ndarray
    vocab_ids: np.ndarray
    max_chars: int

    _ARRAYS = ("chars", "width", "vocab_ids")

    @classmethod
    def spell(cls, spellings: list[str], vocab: Vocabulary, max_chars: int,
              widest_filter: int = 0, lexicon=None) -> "SpellingTables":
        vocab_ids = vocab.encode(spellings).astype(np.int32)
        if lexicon is not None:
            chars = lexicon.spell_all(spellings, max_chars)
            width = np.full(len(spellings), chars.shape[1], np.int32)
            width[PAD_ID] = 0
            return cls(chars, width, vocab_ids, chars.shape[1])
        chars = spell_all(spellings, max_chars)
        last = np.where(chars == EOW_CHAR + 1, np.arange(1, max_chars + 1), 0).max(axis=1)
        width = np.minimum(max_chars, last + widest_filter).astype(np.int32)
        width[PAD_ID] = 0
        return cls(chars, width, vocab_ids, max_chars)

    def save(self, folder: str) -> None:
        """As .npy files in `folder` (for `load` in another process)."""
        for name in self._ARRAYS:
            np.save(os.path.join(folder, f"{name}.npy"), getattr(self, name))

    @classmethod
    def load(cls, folder: str, max_chars: int) -> "SpellingTables":
        """The tables `save` wrote, memory-mapped (processes share the page cache)."""
        return cls(*(np.load(os.path.join(folder, f"{name}.npy"), mmap_mode="r")
                     for name in cls._ARRAYS), max_chars)


@dataclasses.dataclass(frozen=True)
class TableShapes:
    """The token tables' row counts and widths a run's batches take (each
    ascending, at most two); the last of each fits any batch."""
    rows: tuple[int, ...]
    widths: tuple[int, ...]

    def all(self) -> list[tuple[int, int]]:
        return [(r, w) for r in self.rows for w in self.widths]

    def need(self, n_rows: int, width: int) -> tuple[int, int]:
        """The indices of the smallest row count and width that hold a batch."""
        return (next(i for i, r in enumerate(self.rows) if r >= n_rows),
                next(i for i, w in enumerate(self.widths) if w >= width))

    def at(self, need: tuple[int, int]) -> tuple[int, int]:
        return self.rows[need[0]], self.widths[need[1]]


def _table_multiple(n: int) -> int:
    return 128 if n > 1024 else 8


def largest_table(rows: int, unroll_steps: int) -> int:
    """Token-table rows that hold any window of `rows` rows: two spellings a
    position (the two readings) and the padding row."""
    n = 2 * rows * unroll_steps + 1
    return round_up(n, _table_multiple(n))


class StreamBatcher:
    """This process's rows [`rows`) of the global batch of `batch_size` rows
    in `n_groups` row groups (one per device), `unroll_steps` positions each.

    `next_parts()` gives a batch whose token tables are not yet padded (with
    what shape it needs); `assemble` pads it to the shape agreed on;
    `next(batcher)` does both with the batch's own shape. The dict is
    the batch layout of this module's docstring; `mask` is all True in training. With
    `once` (evaluation) the corpus is read once, in order: row r reads
    sentences r, r + B, ... and then only padding (mask False), for
    `batches_once` windows."""

    def __init__(self, corpus: TokenCorpus, vocab: Vocabulary, batch_size: int,
                 unroll_steps: int, max_chars: int, n_groups: int = 1,
                 rows: tuple[int, int] | None = None, seed: int = 0, widest_filter: int = 0,
                 tables: SpellingTables | None = None, shapes: TableShapes | None = None,
                 once: bool = False, lexicon=None):
        if batch_size % n_groups:
            raise DataError(f"batch size {batch_size} does not split into {n_groups} groups")
        self.corpus, self.B, self.U, self.S = corpus, batch_size, unroll_steps, n_groups
        self.per_group = batch_size // n_groups
        start, stop = rows if rows is not None else (0, batch_size)
        if start % self.per_group or stop % self.per_group or not 0 <= start < stop <= batch_size:
            raise DataError(f"rows {start}..{stop} are not whole groups of {self.per_group}")
        self.rows = np.arange(start, stop, dtype=np.int64)
        self.seed, self.once = seed, once
        self.tables = tables or SpellingTables.spell(corpus.spellings, vocab, max_chars,
                                                     widest_filter, lexicon)
        self.shapes = shapes or table_shapes(self)
        self._perms: dict[int, np.ndarray] = {}
        self._scratch: np.ndarray | None = None  # [groups * spellings] for the token tables
        self.restore({"batches": 0, "cursors": np.zeros((len(self.rows), 2), np.int64)})
        self._M = unroll_steps // 2 + 2  # items a window can touch: each has >= 2 positions

    # -- position ---------------------------------------------------------------
    def position(self) -> dict:
        """{"batches": made so far, "cursors": [rows, 2] (next item of the row's
        stream, offset in it)}."""
        return {"batches": self.batches, "cursors": np.stack([self.item, self.offset], 1)}

    def restore(self, position: dict) -> None:
        """Back to `position`; without cursors (None), found again by making
        its batches' windows from the start."""
        if position.get("cursors") is None:
            self.restore({"batches": 0, "cursors": np.zeros((len(self.rows), 2), np.int64)})
            for _ in range(int(position["batches"])):
                self._windows()
            self.batches = int(position["batches"])
            return
        cursors = np.asarray(position["cursors"], np.int64).reshape(-1, 2)
        if len(cursors) != len(self.rows):
            raise DataError(f"a data position of {len(cursors)} rows for {len(self.rows)}")
        self.batches = int(position["batches"])
        self.item, self.offset = cursors[:, 0].copy(), cursors[:, 1].copy()

    # -- streams ----------------------------------------------------------------
    def _sentence_ids(self, items: np.ndarray) -> np.ndarray:
        """Global item numbers -> sentence ids (epoch e reads permutation e;
        `once`: the corpus in order, item i sentence i, and 0 past its end)."""
        N = len(self.corpus)
        if self.once:
            return np.where(items < N, items, 0)
        epoch, k = np.divmod(items, N)
        lo, hi = int(epoch.min()), int(epoch.max())
        if lo == hi:
            return self._permutation(lo)[k]
        out = np.empty(items.shape, np.int64)
        for e in range(lo, hi + 1):
            where = epoch == e
            out[where] = self._permutation(e)[k[where]]
        return out

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 3:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(
                len(self.corpus))
        return self._perms[epoch]

    def _windows(self):
        """The next window of every row: spelling ids of the forward and
        backward inputs and targets, each [rows, U]; the cursors move on."""
        U, M = self.U, self._M
        m_ = np.arange(M)
        items = self.rows[:, None] + (self.item[:, None] + m_) * self.B
        sent = self._sentence_ids(items)
        npos = self.corpus.lengths[sent].astype(np.int64) + 1
        npos[:, 0] -= self.offset
        real = items < len(self.corpus) if self.once else np.ones(items.shape, bool)
        npos[~real] = U + 1  # past the end (`once`): a row stays there, masked
        ends = np.cumsum(npos, axis=1)                               # [R, M]
        R, t = len(self.rows), np.arange(U)
        # item of each position: how many items end at or before it
        marks = np.bincount((np.arange(R)[:, None] * (U + 1) + np.minimum(ends, U)).ravel(),
                            minlength=R * (U + 1)).reshape(R, U + 1)
        m = np.cumsum(marks[:, :U], axis=1)
        before = np.where(m > 0, np.take_along_axis(ends, np.maximum(m - 1, 0), 1), 0)
        j = t - before + np.where(m == 0, self.offset[:, None], 0)  # offset in its sentence
        s = np.take_along_axis(sent, m, 1)
        a, n = self.corpus.starts[s], self.corpus.lengths[s].astype(np.int64)
        tok = self.corpus.tokens
        live = np.take_along_axis(real, m, 1)                       # [R, U]
        fwd_in, fwd_out = tok[a + j] * live, tok[a + j + 1] * live  # PAD_ID where not live
        bwd_in, bwd_out = tok[a + n + 1 - j] * live, tok[a + n - j] * live
        done = (ends <= U).sum(1)                                    # items used up
        before_u = np.where(done > 0, np.take_along_axis(ends, np.maximum(done - 1, 0)[:, None],
                                                         1)[:, 0], 0)
        self.offset = U - before_u + np.where(done == 0, self.offset, 0)
        self.item = self.item + done
        return np.stack([fwd_in, bwd_in]), np.stack([fwd_out, bwd_out]), live

    # -- batches ----------------------------------------------------------------
    def next_parts(self) -> dict:
        """The next batch before padding: {"spellings": [u] the tables'
        spelling ids, group by group; "counts": [G] each group's; "token_index",
        "targets", "mask"; "need": the shape indices it needs}."""
        inputs, outputs, live = self._windows()                      # [2, R, U]
        R, G = len(self.rows), len(self.rows) // self.per_group
        K = len(self.tables.vocab_ids)
        # distinct spellings of each group without sorting: positions in group
        # order, the last position of each (group, spelling) stands for it
        flat = inputs.transpose(1, 0, 2).reshape(G, -1)              # [G, 2 * rows * U]
        keys = (flat + (np.arange(G) * K)[:, None]).ravel()
        if self._scratch is None or len(self._scratch) < G * K:
            self._scratch = np.empty(G * K, np.int64)
        n = len(keys)
        self._scratch[keys] = np.arange(n)
        rep = self._scratch[keys]
        kept = np.flatnonzero(rep == np.arange(n))
        counts = np.bincount(kept // flat.shape[1], minlength=G)
        slot = np.zeros(n, np.int32)
        slot[kept] = np.arange(len(kept)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
        index = slot[rep].reshape(R, 2, self.U).transpose(1, 0, 2)
        spellings = flat.ravel()[kept]
        width = int(self.tables.width[spellings].max())
        self.batches += 1
        return {"spellings": spellings, "counts": counts, "token_index": index,
                "targets": self.tables.vocab_ids[outputs] * live,
                "mask": live,
                "need": self.shapes.need(int(counts.max()) + 1, width)}

    def assemble(self, parts: dict, need: tuple[int, int] | None = None) -> dict:
        """A batch dict from `next_parts`' output, its tables `need`'s shape."""
        n, width = self.shapes.at(need if need is not None else parts["need"])
        counts = parts["counts"]
        group = np.repeat(np.arange(len(counts)), counts)
        slot = np.arange(len(group)) - np.repeat(np.cumsum(counts) - counts, counts) + 1
        token_chars = np.zeros((len(counts), n, width), np.int32)
        token_chars[group, slot] = self.tables.chars[parts["spellings"], :width]
        return {"token_chars": token_chars, "token_index": parts["token_index"],
                "targets": parts["targets"], "mask": parts["mask"]}

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return self.assemble(self.next_parts())


def batches_once(corpus: TokenCorpus, batch_size: int, unroll_steps: int) -> int:
    """How many windows `once` reads the corpus in: its longest row's (row r
    reads sentences r, r + B, ...; a sentence of n words is n + 1 positions)."""
    positions = np.bincount(np.arange(len(corpus)) % batch_size,
                            weights=np.asarray(corpus.lengths, np.float64) + 1,
                            minlength=batch_size)
    return int(np.ceil(positions.max() / unroll_steps))


def table_shapes(batcher: StreamBatcher, sample_batches: int = 16, margin: float = 1.25
                 ) -> TableShapes:
    """The run's table shapes. The largest fits every batch there can be: two
    rows a position plus the padding row, or the corpus' spellings if fewer;
    the widest spelling's width. Where smaller, a second one covers the first
    `sample_batches` batches of row group 0 with a `margin`. The sample is
    the same for every process, whatever its rows."""
    per_group, U, C = batcher.per_group, batcher.U, batcher.tables.max_chars
    n_spellings = len(batcher.tables.width)
    largest = min(largest_table(per_group, U), round_up(n_spellings + 1, _table_multiple(
        n_spellings + 1)))
    widest = min(C, round_up(int(batcher.tables.width.max()), 8))
    sample = StreamBatcher(batcher.corpus, None, per_group, U, C, 1, seed=batcher.seed,
                           tables=batcher.tables, shapes=TableShapes((largest,), (widest,)))
    most, wide = 0, 0
    for _ in range(sample_batches):
        parts = sample.next_parts()
        most = max(most, int(parts["counts"].max()) + 1)
        wide = max(wide, int(batcher.tables.width[parts["spellings"]].max()))
    small = round_up(int(most * margin), _table_multiple(int(most * margin)))
    narrow = round_up(wide + 2, 8)
    rows = (small, largest) if small < largest else (largest,)
    widths = (narrow, widest) if narrow < widest else (widest,)
    return TableShapes(rows, widths)
