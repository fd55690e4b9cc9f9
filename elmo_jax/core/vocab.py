"""The word vocabulary of the softmax, in bilm-tf's format.

One token a line: `<S>`, `</S>`, `<UNK>`, then words by descending frequency
(the log-uniform sampler assumes that order). bilm-tf skips a `!!!MAXTERMID`
line; so do we.
"""
from __future__ import annotations

import collections
import gzip
import hashlib
import os
from typing import Iterable

import numpy as np

from elmo_jax.storage import copies, paths
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.storage.files import split_lines, write_text

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)


class VocabError(UserError, ValueError):
    """A vocabulary file that bilm-tf could not train with."""


class Vocabulary:
    """Token <-> id. Ids follow the file's order."""

    def __init__(self, words: list[str]):
        self.words = list(words)
        self.index: dict[str, int] = {}
        for i, w in enumerate(self.words):
            if not w or any(c.isspace() for c in w):
                raise VocabError(f"entry {i} ({w!r}) is empty or contains whitespace")
            if w in self.index:
                raise VocabError(f"'{w}' appears twice (entries {self.index[w]} and {i})")
            self.index[w] = i
        missing = [s for s in SPECIALS if s not in self.index]
        if missing:
            raise VocabError(f"the vocabulary lacks the special token(s) {', '.join(missing)}; "
                             "bilm-tf vocabularies start with <S>, </S>, <UNK>")
        self.bos, self.eos, self.unk = (self.index[s] for s in SPECIALS)

    def fingerprint(self) -> str:
        """"N words, #HASH": its words in order, for comparing with another
        process's."""
        digest = hashlib.sha1("\n".join(self.words).encode("utf-8")).hexdigest()[:12]
        return f"{len(self.words)} words, #{digest}"

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Token ids, <UNK> for unknown tokens; no boundaries added."""
        get, unk = self.index.get, self.unk
        return np.array([get(t, unk) for t in tokens], np.int32)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Vocabulary":
        path = paths.check(path)
        if not paths.exists(path):
            raise MissingFile(f"vocabulary file not found: {path} (build one with "
                                    "`python train.py vocab --train_files GLOB --out PATH`)")
        words = read_word_list(path)
        if not words:
            raise VocabError(f"{path}: the vocabulary file is empty")
        try:
            return cls(words)
        except VocabError as e:
            raise VocabError(f"{path}: {e}") from None

    def to_file(self, path: str | os.PathLike) -> None:
        write_text(path, "\n".join(self.words) + "\n")


def read_word_list(path: str | os.PathLike) -> list[str]:
    """The words of a one-word-a-line file (any vocabulary file; no checks on
    special tokens), for caching token vectors."""
    if not paths.exists(path):
        raise MissingFile(f"word list not found: {path}")
    shown, path = path, copies.local_copy(path)
    opener = gzip.open if os.fspath(path).endswith(".gz") else open  # NLPL's vocab.txt.gz
    with opener(path, "rt", encoding="utf-8", newline="") as fh:  # lines end at "\n" only
        try:
            text = fh.read()
        except UnicodeDecodeError as e:
            raise VocabError(f"{shown}: not valid UTF-8 ({e}); convert the file to UTF-8") from None
    return [w for w in (line.strip() for line in split_lines(text))
            if w and w != "!!!MAXTERMID"]


def count_tokens(sentences: Iterable[list[str]]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for s in sentences:
        counts.update(s)
    return counts


def build_vocab(counts: collections.Counter, max_vocab: int | None = None,
                min_count: int = 1) -> Vocabulary:
    """<S>, </S>, <UNK>, then words with count >= min_count by descending count
    (ties alphabetically), at most `max_vocab` entries in all (specials included,
    as bilm-tf counts them)."""
    if max_vocab is not None and max_vocab < 4:
        raise VocabError(f"max_vocab must be at least 4 (3 specials and a word), got {max_vocab}")
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                   key=lambda w: (-counts[w], w))
    if not words:
        raise VocabError(f"no word occurs at least {min_count} times: is the corpus empty?")
    if max_vocab is not None:
        words = words[:max_vocab - len(SPECIALS)]
    return Vocabulary(list(SPECIALS) + words)
