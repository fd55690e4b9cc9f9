"""Tokens -> character ids, in AllenNLP's (shifted bilm-tf) convention.

Each token becomes `max_chars` ids: begin-of-word, its UTF-8 bytes (cut to
`max_chars - 2`), end-of-word, then padding; every id is shifted by +1 so that
an all-zero row marks a padded token. The literal tokens `<S>` and `</S>` get
the sentence-boundary spellings. Sentence boundaries are *not* added here: the
model adds them (see `model.add_sentence_boundaries`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from elmo_jax.core.batching import round_up

# Unshifted ids, as bilm-tf's UnicodeCharsVocabulary defines them (bytes are 0..255).
BOS_CHAR = 256  # begin of sentence
EOS_CHAR = 257  # end of sentence
BOW_CHAR = 258  # begin of word
EOW_CHAR = 259  # end of word
PAD_CHAR = 260  # padding inside a token
MAX_CHARS = 50


def _marker_ids(char: int, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, PAD_CHAR + 1, np.int32)
    ids[:3] = (BOW_CHAR + 1, char + 1, EOW_CHAR + 1)
    return ids


def bos_char_ids(max_chars: int = MAX_CHARS) -> np.ndarray:
    """[max_chars] int32: the shifted spelling of `<S>`."""
    return _marker_ids(BOS_CHAR, max_chars)


def eos_char_ids(max_chars: int = MAX_CHARS) -> np.ndarray:
    """[max_chars] int32: the shifted spelling of `</S>`."""
    return _marker_ids(EOS_CHAR, max_chars)


def boundary_ids(char_cnn) -> np.ndarray:
    """[2, ids per token] int32: the spellings of the sentence boundaries `<S>`
    and `</S>` for a model's `options.char_cnn` (UTF-8 or a lexicon)."""
    if char_cnn.spelling == "lexicon":
        from elmo_jax.core.lexicon import boundary_ids as lexicon_boundaries

        return lexicon_boundaries(char_cnn.max_characters_per_token, char_cnn.word_dim > 0)
    C = char_cnn.max_characters_per_token
    return np.stack([bos_char_ids(C), eos_char_ids(C)])


def token_to_char_ids(token: str, max_chars: int = MAX_CHARS) -> np.ndarray:
    """[max_chars] int32 shifted character ids of one token.

    Raises TypeError for a non-string, ValueError for an empty token or one that
    cannot be written as UTF-8 (a lone surrogate, e.g. from `surrogateescape`)."""
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
    if token == "<S>":
        return bos_char_ids(max_chars)
    if token == "</S>":
        return eos_char_ids(max_chars)
    if not token:
        raise ValueError("empty token: a token must have at least one character")
    try:
        data = token.encode("utf-8")[: max_chars - 2]
    except UnicodeEncodeError as e:
        raise ValueError(
            f"token {token!r} is not valid Unicode text (character {e.start} cannot be "
            "written as UTF-8); decode input files as UTF-8 with errors='strict'") from None
    ids = np.full(max_chars, PAD_CHAR + 1, np.int32)
    ids[0] = BOW_CHAR + 1
    ids[1:len(data) + 1] = np.frombuffer(data, np.uint8).astype(np.int32) + 1
    ids[len(data) + 1] = EOW_CHAR + 1
    return ids


def trim_padding(char_ids: np.ndarray, widest_filter: int, multiple: int = 8) -> np.ndarray:
    """char_ids [..., C] cut to their first C' characters, C' <= C, where the
    character CNN gives exactly the same token vectors.

    Past a token's end-of-word mark every id is padding, so every convolution
    window made only of padding has one same value: the max over positions needs
    one such window, not all C - L - w + 1 of them (L the token's ids up to its
    end mark). C' = max L + widest_filter keeps that first one for every filter
    width (and every window that touches a real character); it is rounded up to
    a multiple of `multiple` (few distinct shapes, few compilations) and is C
    when a token is too long to leave a padding window at all. On English text
    C' is 24-32 of 50: the convolutions then cost half or less."""
    C = char_ids.shape[-1]
    real = (char_ids > 0) & (char_ids != PAD_CHAR + 1)
    L = int(np.max(np.where(real, np.arange(1, C + 1), 0), initial=0))
    width = min(C, round_up(L + widest_filter, multiple))
    return char_ids[..., :width]


def batch_to_char_ids(sentences: Sequence[Sequence[str]], max_chars: int = MAX_CHARS,
                      min_length: int = 0) -> np.ndarray:
    """Character ids of a batch of tokenised sentences (bilm-tf's and AllenNLP's
    ids: each token's UTF-8 bytes + 1 between begin- and end-of-word marks).

    Args:
        sentences: B sentences, each a list of token strings. An empty
            sentence is allowed (an all-padding row); an empty batch is not.
        max_chars: C, characters per token (longer tokens are cut, keeping
            their end mark); the model's `max_characters_per_token`.
        min_length: the fewest token positions T (pads short batches to a
            fixed shape).

    Returns:
        [B, T, C] int32, T = max(longest sentence, min_length); sentences
        shorter than T end in all-zero tokens.

    Raises:
        TypeError: not a list of lists of strings (a sentence given as a str).
        ValueError: an empty batch, an empty token, or text that is not valid
            Unicode; names the sentence and token.
    """
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError("batch_to_char_ids takes a list of sentences, each a list of token "
                        f"strings; got {type(sentences).__name__}")
    if len(sentences) == 0:
        raise ValueError("batch_to_char_ids got an empty batch: pass at least one sentence")
    if all(isinstance(s, str) and not any(c.isspace() for c in s) for s in sentences):  # tokens
        shown = ", ".join(repr(s) for s in sentences[:3]) + (", ..." if len(sentences) > 3 else "")
        raise TypeError("batch_to_char_ids takes a batch of sentences: for one sentence, wrap "
                        f"its tokens in a list: [[{shown}]]")
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise TypeError(f"sentence {i} is a str, not a list of tokens: split it first "
                            f"(e.g. {s[:30]!r}.split())")
    T = max(min_length, max(len(s) for s in sentences))
    out = np.zeros((len(sentences), T, max_chars), np.int32)
    for i, sentence in enumerate(sentences):
        for j, token in enumerate(sentence):
            try:
                out[i, j] = token_to_char_ids(token, max_chars)
            except (TypeError, ValueError) as e:
                raise type(e)(f"sentence {i}, token {j}: {e}") from None
    return out
