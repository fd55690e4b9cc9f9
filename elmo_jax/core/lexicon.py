"""Tokens spelled with a character dictionary (and a word dictionary), as
HIT-SCIR's ELMoForManyLangs spells them: the token encoder of a model whose
options say `char_cnn.spelling = "lexicon"`.

A token of at most `max_chars - 2` characters (longer ones are cut to that
many, by code points, before both look-ups) becomes `max_chars` ids:

    [BOW, row(c1), ..., row(cn), EOW, PAD, ..., PAD] [+ its word row, last]

with unknown characters and words at their `<oov>` rows. The tokens `<bos>` and
`<eos>` (the sentence boundaries the model adds) are spelled
`[BOW, row(<bos>), EOW, PAD, ...]`. Rows are renumbered so that the special
ones sit at fixed places (below) and row 0 is the padding token, whose ids
are all zero, as in bilm-tf's convention (`model.token_mask`):

    characters: 0 padding token, 1 <pad>, 2 BOW, 3 EOW, 4 <oov>, 5 <bos>, 6 <eos>, 7.. the rest
    words:      0 padding token, 1 <oov>, 2 <bos>, 3 <eos>, 4 <pad>, 5.. the rest

BOW is the row ELMoForManyLangs writes first in a token, the one its
`char.dic` calls `<eow>` (its code swaps the two names, consistently); EOW
the one it calls `<bow>`. `manylangs.py` reads its dictionaries; an export
stores a lexicon as `lexicon.json` (the rest of each list, in row order).
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from elmo_jax.storage import paths
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.storage.files import read_json, write_json

PAD, BOW, EOW, OOV, BOS, EOS = 1, 2, 3, 4, 5, 6
FIRST_CHAR = 7
WORD_OOV, WORD_BOS, WORD_EOS, WORD_PAD = 1, 2, 3, 4
FIRST_WORD = 5
LEXICON_FILE = "lexicon.json"


class LexiconError(UserError, ValueError):
    """A dictionary that cannot spell tokens; names the file and the entry."""


def boundary_ids(max_chars: int, with_words: bool) -> np.ndarray:
    """[2, ids per token] int32: the spellings of `<bos>` and `<eos>`."""
    out = np.full((2, max_chars + with_words), PAD, np.int32)
    out[:, 0], out[:, 2] = BOW, EOW
    out[:, 1] = (BOS, EOS)
    if with_words:
        out[:, -1] = (WORD_BOS, WORD_EOS)
    return out


class Lexicon:
    """Character rows and word rows (see the module docstring).

    Args:
        chars: the characters of rows 7, 8, ... in order.
        words: the words of rows 5, 6, ..., or None for a model without a
            word embedding.
    """

    def __init__(self, chars: Sequence[str], words: Sequence[str] | None = None):
        self.chars = list(chars)
        self.words = None if words is None else list(words)
        self._char_rows = {c: FIRST_CHAR + i for i, c in enumerate(self.chars)}
        self._word_rows = (None if words is None else {
            "<oov>": WORD_OOV, "<pad>": WORD_PAD,
            **{w: FIRST_WORD + i for i, w in enumerate(self.words)}})

    @property
    def n_characters(self) -> int:
        """Rows of the character table, the padding token's included."""
        return FIRST_CHAR + len(self.chars)

    @property
    def char_rows(self) -> dict[str, int]:
        """{character: its row} (others spell as `OOV`)."""
        return dict(self._char_rows)

    @property
    def word_rows(self) -> dict[str, int] | None:
        """{word: its row} (others are `WORD_OOV`), None without words."""
        return None if self._word_rows is None else dict(self._word_rows)

    @property
    def n_words(self) -> int:
        return 0 if self.words is None else FIRST_WORD + len(self.words)

    def token_ids(self, token: str, max_chars: int) -> np.ndarray:
        """[max_chars (+1 with words)] int32 ids of one token."""
        if not isinstance(token, str):
            raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
        if not token:
            raise ValueError("empty token: a token must have at least one character")
        if token in ("<bos>", "<eos>"):
            return boundary_ids(max_chars, self.words is not None)[int(token == "<eos>")]
        token = token[:max_chars - 2]
        out = np.full(max_chars + (self.words is not None), PAD, np.int32)
        out[0] = BOW
        out[1:len(token) + 1] = [self._char_rows.get(c, OOV) for c in token]
        out[len(token) + 1] = EOW
        if self.words is not None:
            out[-1] = self._word_rows.get(token, WORD_OOV)
        return out

    def spell_all(self, spellings: Sequence[str], max_chars: int) -> np.ndarray:
        """[K, ids per token] int32 for a corpus' spellings (`data.streams`):
        "" (the padding spelling) all zeros, `<S>` and `</S>` the boundaries."""
        width = max_chars + (self.words is not None)
        out = np.zeros((len(spellings), width), np.int32)
        bounds = boundary_ids(max_chars, self.words is not None)
        for i, w in enumerate(spellings):
            if w in ("<S>", "</S>"):
                out[i] = bounds[int(w == "</S>")]
            elif w:
                out[i] = self.token_ids(w, max_chars)
        return out

    def batch_ids(self, sentences: Sequence[Sequence[str]], max_chars: int,
                  min_length: int = 0) -> np.ndarray:
        """[B, T, ids per token] int32; shorter sentences padded with zeros."""
        if isinstance(sentences, str) or not isinstance(sentences, Sequence) or not sentences:
            raise ValueError("batch_ids takes a non-empty list of sentences (lists of tokens)")
        T = max(min_length, max(len(s) for s in sentences))
        out = np.zeros((len(sentences), T, max_chars + (self.words is not None)), np.int32)
        for i, sentence in enumerate(sentences):
            if isinstance(sentence, str):
                raise TypeError(f"sentence {i} is a str, not a list of tokens: split it first")
            for j, token in enumerate(sentence):
                try:
                    out[i, j] = self.token_ids(token, max_chars)
                except (TypeError, ValueError) as e:
                    raise type(e)(f"sentence {i}, token {j}: {e}") from None
        return out

    def save(self, folder: str | os.PathLike) -> None:
        write_json(paths.join(folder, LEXICON_FILE),
                   {"chars": self.chars, "words": self.words})

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "Lexicon":
        path = paths.join(folder, LEXICON_FILE)
        d = read_json(path, "lexicon file", LexiconError)
        if not isinstance(d, dict) or not isinstance(d.get("chars"), list):
            raise LexiconError(f"{path}: expected {{\"chars\": [...], \"words\": [...] or null}}")
        return cls(d["chars"], d.get("words"))


def read_dic(path: str) -> dict[str, int]:
    """ELMoForManyLangs' `token<TAB>id` file, parsed as its Embedder does
    (lines split as Python's `splitlines`; a line of one field is the
    ideographic space U+3000, which `strip()` took away)."""
    if not os.path.exists(path):
        raise MissingFile(f"dictionary not found: {path}")
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            text = fh.read()
        except UnicodeDecodeError as e:
            raise LexiconError(f"{path}: not UTF-8 text ({e})") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split("\t")
        if fields == [""]:
            continue
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise LexiconError(f"{path}, line {n}: expected 'token<TAB>id', got {line!r}")
        out[fields[0]] = int(fields[1])
    return out


def from_manylangs(chars: dict[str, int], words: dict[str, int] | None, where: str
                   ) -> tuple[Lexicon, np.ndarray, np.ndarray | None]:
    """A Lexicon from ELMoForManyLangs' dictionaries, and for each table the
    original row of each new row ([n] int64, -1 for row 0)."""
    def special(d, name, what):
        if name not in d:
            raise LexiconError(f"{where}: the {what} dictionary has no {name} entry")
        return d[name]

    firsts = [special(chars, n, "character") for n in ("<pad>", "<eow>", "<bow>", "<oov>",
                                                       "<bos>", "<eos>")]
    rest = sorted((i, c) for c, i in chars.items()
                  if c not in ("<pad>", "<eow>", "<bow>", "<oov>", "<bos>", "<eos>"))
    lexicon_chars = [c for _, c in rest]
    char_rows = np.array([-1] + firsts + [i for i, _ in rest], np.int64)
    if words is None:
        return Lexicon(lexicon_chars), char_rows, None
    oov = special(words, "<oov>", "word")
    wfirst = [oov, words.get("<bos>", oov), words.get("<eos>", oov),
              special(words, "<pad>", "word")]
    wrest = sorted((i, w) for w, i in words.items()
                   if w not in ("<oov>", "<bos>", "<eos>", "<pad>"))
    word_rows = np.array([-1] + wfirst + [i for i, _ in wrest], np.int64)
    return Lexicon(lexicon_chars, [w for _, w in wrest]), char_rows, word_rows
