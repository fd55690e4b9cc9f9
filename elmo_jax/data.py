"""Text -> training windows, as bilm-tf's `_get_batch` makes them.

A *sentence source* yields tokenised sentences forever (training) or once
(evaluation) and can say where it is (`position()`) and go back there
(`restore()`). The *batcher* keeps `B` parallel streams: each row takes the
next sentence when its current one is used up, so the LSTM state of a row
carries meaning from one window of `unroll_steps` to the next.

Each sentence `w1 .. wn` is read as `<S> w1 .. wn </S>` by the forward model
and `</S> wn .. w1 <S>` by the backward one. Following bilm-tf, a sentence of
n words gives n + 1 positions: the inputs are the sequence without its last
token and the targets are the sequence without its first.

A batch is a dict of numpy arrays:
    char_ids [2, B, U, C] int32  forward reading, backward reading
    targets  [2, B, U]    int32  the next token of each reading (vocabulary ids)
    mask     [B, U]       bool   False only where an evaluation stream ran dry
"""
from __future__ import annotations

import glob
import os
from typing import Iterator

import numpy as np

from elmo_jax.chars import MAX_CHARS, token_to_char_ids
from elmo_jax.vocab import BOS, EOS, Vocabulary


class DataError(ValueError):
    """Input text that cannot be trained on; names the file (and line)."""


def list_shards(pattern: str) -> list[str]:
    """The files matching a glob, sorted; an error when there are none."""
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not paths:
        raise DataError(f"no files match {pattern!r}")
    return paths


def read_sentences(path: str) -> list[list[str]]:
    """Whitespace-tokenised sentences of a sentence-per-line UTF-8 file; blank
    lines are skipped."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: not valid UTF-8 (byte {raw[e.start]:#04x} at "
                        f"offset {e.start}); convert the file to UTF-8") from None
    return [s for s in (line.split() for line in text.splitlines()) if s]


class TextSource:
    """Sentences from text shards, forever, in a seeded order: each epoch
    shuffles the shards, and the sentences within each shard. With several
    processes, process i reads shards i, i + n, i + 2n, ... only."""

    def __init__(self, pattern: str, seed: int = 0, process_index: int = 0,
                 process_count: int = 1):
        shards = list_shards(pattern)
        self.shards = shards[process_index::process_count]
        if not self.shards:
            raise DataError(f"{len(shards)} shard(s) matching {pattern!r} cannot feed "
                            f"{process_count} processes: split the corpus into at least "
                            f"{process_count} files")
        self.seed = seed
        self.epoch, self.shard_pos, self.sent_pos = 0, 0, 0
        self._loaded: tuple | None = None  # (epoch, shard_pos, sentences in order)

    def _shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))

    def _sentences(self) -> list[list[str]]:
        key = (self.epoch, self.shard_pos)
        if self._loaded is None or self._loaded[:2] != key:
            path = self.shards[self._shard_order(self.epoch)[self.shard_pos]]
            sentences = read_sentences(path)
            order = np.random.default_rng([self.seed, self.epoch, self.shard_pos]).permutation(
                len(sentences))
            self._loaded = key + ([sentences[i] for i in order],)
        return self._loaded[2]

    def next_sentence(self) -> list[str]:
        for _ in range(len(self.shards) + 1):
            sentences = self._sentences()
            if self.sent_pos < len(sentences):
                self.sent_pos += 1
                return sentences[self.sent_pos - 1]
            self.sent_pos = 0
            self.shard_pos += 1
            if self.shard_pos == len(self.shards):
                self.shard_pos = 0
                self.epoch += 1
        raise DataError(f"no sentences in {', '.join(self.shards)}: the corpus is empty")

    def position(self) -> dict:
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "sent_pos": self.sent_pos}

    def restore(self, position: dict) -> None:
        self.epoch, self.shard_pos, self.sent_pos = (
            position["epoch"], position["shard_pos"], position["sent_pos"])


class OnceSource:
    """Sentences from files in order, once (evaluation)."""

    def __init__(self, pattern: str):
        self.paths = list_shards(pattern)

    def __iter__(self) -> Iterator[list[str]]:
        for path in self.paths:
            yield from read_sentences(path)


class Lm1bSource:
    """The One Billion Word Benchmark through TensorFlow Datasets, behind the
    same interface as TextSource (optional: `pip install tensorflow-datasets`;
    the data must already be prepared in TFDS's data dir, or downloadable).
    Its sentences are already tokenised; epochs reshuffle files with the seed."""

    def __init__(self, split: str = "train", seed: int = 0, process_index: int = 0,
                 process_count: int = 1, data_dir: str | None = None):
        try:
            import tensorflow_datasets as tfds
        except ImportError:
            raise DataError("the lm1b source needs TensorFlow Datasets: "
                            "pip install tensorflow-datasets tensorflow-cpu") from None
        self._tfds = tfds
        self.split = tfds.even_splits(split, n=process_count)[process_index]
        self.seed, self.data_dir = seed, data_dir
        self.epoch, self.consumed = 0, 0
        self._it = None

    def _iterator(self):
        read_config = self._tfds.ReadConfig(shuffle_seed=self.seed + self.epoch)
        ds = self._tfds.load("lm1b", split=self.split, shuffle_files=True, data_dir=self.data_dir,
                             read_config=read_config)
        return iter(self._tfds.as_numpy(ds.skip(self.consumed)))

    def next_sentence(self) -> list[str]:
        for _ in range(2):
            if self._it is None:
                self._it = self._iterator()
            for example in self._it:
                self.consumed += 1
                tokens = example["text"].decode("utf-8").split()
                if tokens:
                    return tokens
            if self.consumed == 0:
                raise DataError(f"lm1b split {self.split!r} is empty")
            self.epoch, self.consumed, self._it = self.epoch + 1, 0, None
        raise DataError(f"lm1b split {self.split!r} has no non-empty sentences")

    def position(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def restore(self, position: dict) -> None:
        self.epoch, self.consumed, self._it = position["epoch"], position["consumed"], None


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

    `source` is a TextSource/Lm1bSource (training: never runs dry) or any
    iterable of sentences (evaluation: the last windows are padded and
    `mask` marks the real positions; iteration stops when every row is empty)."""

    def __init__(self, source, vocab: Vocabulary, batch_size: int, unroll_steps: int,
                 max_chars: int = MAX_CHARS):
        self.source, self.vocab = source, vocab
        self.B, self.U, self.C = batch_size, unroll_steps, max_chars
        self.chars = CharIdCache(max_chars)
        self.rows: list[list[str]] = [[] for _ in range(batch_size)]  # current sentence, forward
        self.offsets = [0] * batch_size
        self._once = None if hasattr(source, "next_sentence") else iter(source)

    def _next_sentence(self) -> list[str] | None:
        if self._once is None:
            return self.source.next_sentence()
        return next(self._once, None)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        B, U, C = self.B, self.U, self.C
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
        char_ids = np.zeros((2, B, U, C), np.int32)
        for d in range(2):
            for i in range(B):
                for t in range(U):
                    if mask[i, t]:
                        char_ids[d, i, t] = self.chars(tokens[d][i][t])
        return {"char_ids": char_ids, "targets": targets, "mask": mask}

    # -- resumable position ---------------------------------------------------
    def position(self) -> dict:
        src = self.source.position() if self._once is None else None
        return {"source": src, "rows": [list(r) for r in self.rows], "offsets": list(self.offsets)}

    def restore(self, position: dict) -> None:
        if len(position["rows"]) != self.B:
            raise DataError(f"the saved data position has {len(position['rows'])} rows, "
                            f"this run has batch size {self.B}")
        self.source.restore(position["source"])
        self.rows = [list(r) for r in position["rows"]]
        self.offsets = list(position["offsets"])
