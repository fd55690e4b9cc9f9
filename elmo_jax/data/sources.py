"""Where sentences come from: text files (sentence per line, read as bilm-tf
reads them), TFDS's lm1b, a vocabulary counted from files.

A *sentence source* yields tokenised sentences forever (training) or once
(evaluation) and can say where it is (`position()`) and go back there
(`restore()`), so that a run resumes exactly.
"""
from __future__ import annotations

import glob
import os
from typing import Iterator

import numpy as np

from elmo_jax.files import split_lines
from elmo_jax.vocab import Vocabulary, build_vocab, count_tokens


class DataError(ValueError):
    """Input text that cannot be trained on; names the file (and line)."""


def list_shards(pattern: str) -> list[str]:
    """The files matching a glob, sorted; an error when there are none."""
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not paths:
        raise DataError(f"no files match {pattern!r}")
    return paths


def read_sentences(path: str, keep_empty: bool = False) -> list[list[str]]:
    """Whitespace-tokenised sentences of a sentence-per-line UTF-8 file.

    Lines end at "\n" (or "\r\n") only (`files.split_lines`); tokens are
    split on any Unicode whitespace, as bilm-tf's `str.split()` does. Blank
    lines are skipped unless `keep_empty` (then line i is sentence i, and a
    blank line is a sentence of no tokens)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: not valid UTF-8 (byte {raw[e.start]:#04x} at "
                        f"offset {e.start}); convert the file to UTF-8") from None
    sentences = [line.split() for line in split_lines(text)]
    return sentences if keep_empty else [s for s in sentences if s]


def vocab_from_files(pattern: str, max_vocab: int | None = None, min_count: int = 1
                     ) -> tuple[Vocabulary, dict]:
    """A bilm-tf vocabulary of the files matching `pattern`, and its size,
    the corpus' token count and the share of tokens it covers."""
    counts = count_tokens(s for p in list_shards(pattern) for s in read_sentences(p))
    v = build_vocab(counts, max_vocab, min_count)
    total = sum(counts.values())
    covered = sum(counts[w] for w in v.words[3:])
    return v, {"size": len(v), "tokens": total, "coverage": round(covered / max(1, total), 4)}


def shuffle_key(seed: int, process_index: int, process_count: int) -> tuple[int, ...]:
    """The seed of a process's shuffles: its own in a run of several processes
    (one seed for all would shuffle every process's share alike: process 1
    would read the neighbour of the record process 0 reads); the plain seed
    alone for a single process."""
    return (seed,) if process_count == 1 else (seed, process_count, process_index)


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
        self.key = shuffle_key(seed, process_index, process_count)
        self.epoch, self.shard_pos, self.sent_pos = 0, 0, 0
        self._loaded: tuple | None = None  # (epoch, shard_pos, sentences in order)

    def _shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([*self.key, epoch]).permutation(len(self.shards))

    def _sentences(self) -> list[list[str]]:
        key = (self.epoch, self.shard_pos)
        if self._loaded is None or self._loaded[:2] != key:
            path = self.shards[self._shard_order(self.epoch)[self.shard_pos]]
            sentences = read_sentences(path)
            order = np.random.default_rng([*self.key, self.epoch, self.shard_pos]).permutation(
                len(sentences))
            self._loaded = key + ([sentences[i] for i in order],)
        return self._loaded[2]

    def next_sentence(self) -> list[str]:
        empty: set[int] = set()  # shards found empty since the last sentence
        while True:
            sentences = self._sentences()
            if self.sent_pos < len(sentences):
                self.sent_pos += 1
                return sentences[self.sent_pos - 1]
            if not sentences:  # an empty shard is skipped; all empty is an error
                empty.add(int(self._shard_order(self.epoch)[self.shard_pos]))
                if len(empty) == len(self.shards):
                    raise DataError(f"no sentences in {', '.join(self.shards)}: the corpus is "
                                    "empty")
            self.sent_pos = 0
            self.shard_pos += 1
            if self.shard_pos == len(self.shards):
                self.shard_pos = 0
                self.epoch += 1

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


class IndexedSource:
    """Sentences from a random-access collection of records (`len` and `[]`),
    forever, in a seeded order reshuffled every epoch. Process i of n reads
    records i, i + n, i + 2n, ... only."""

    def __init__(self, records, text_key: str | None = None, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, name: str = "records"):
        self.records, self.text_key, self.name = records, text_key, name
        self.key = shuffle_key(seed, process_index, process_count)
        self.mine = np.arange(process_index, len(records), process_count, dtype=np.int64)
        if len(self.mine) == 0:
            raise DataError(f"{name} has no records for process {process_index} of {process_count}")
        self.epoch, self.pos = 0, 0
        self._order: tuple[int, np.ndarray] | None = None

    def _permutation(self) -> np.ndarray:
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, np.random.default_rng([*self.key, self.epoch]).permutation(
                self.mine))
        return self._order[1]

    def next_sentence(self) -> list[str]:
        for _ in range(len(self.mine) + 1):
            if self.pos == len(self.mine):
                self.epoch, self.pos = self.epoch + 1, 0
            record = self.records[int(self._permutation()[self.pos])]
            self.pos += 1
            text = record[self.text_key] if self.text_key else record
            tokens = (text.decode("utf-8") if isinstance(text, bytes) else text).split()
            if tokens:
                return tokens
        raise DataError(f"{self.name} holds no non-empty sentences")

    def position(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def restore(self, position: dict) -> None:
        self.epoch, self.pos = position["epoch"], position["pos"]


def lm1b_source(split: str = "train", seed: int = 0, process_index: int = 0,
                process_count: int = 1, data_dir: str | None = None) -> IndexedSource:
    """The One Billion Word Benchmark through TensorFlow Datasets' random-access
    `data_source` (optional: `pip install tensorflow-datasets`; the dataset must be
    prepared in TFDS's data dir, which needs the network once). Its sentences
    are already tokenised."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError("the lm1b source needs TensorFlow Datasets: "
                        "pip install tensorflow-datasets") from None
    try:
        # never download: TFDS would fetch lm1b from the open web
        records = tfds.data_source("lm1b", split=split, data_dir=data_dir, download=False)
    except Exception as e:  # not prepared, no network, ...
        raise DataError(f"TFDS lm1b ({split}) is not available here: {e}") from None
    return IndexedSource(records, "text", seed, process_index, process_count, f"lm1b[{split}]")
