"""Where sentences come from: text files (sentence per line, read as bilm-tf
reads them; held-out files read once in order), TFDS's lm1b, a vocabulary
counted from files. Training reads them through `streams.TokenCorpus`.
"""
from __future__ import annotations

from elmo_jax.storage import copies, paths
from elmo_jax.errors import UserError
from elmo_jax.storage.files import split_lines
from elmo_jax.core.vocab import Vocabulary, build_vocab, count_tokens


class DataError(UserError, ValueError):
    """Input text that cannot be trained on; names the file (and line)."""


def list_shards(pattern: str) -> list[str]:
    """The files matching a glob (local or in a bucket), sorted; an error
    when there are none."""
    found = paths.glob(pattern)
    if not found:
        raise DataError(f"no files match {pattern!r}")
    return found


def read_sentences(path: str, keep_empty: bool = False) -> list[list[str]]:
    """Whitespace-tokenised sentences of a sentence-per-line UTF-8 file.

    Lines end at "\n" (or "\r\n") only (`files.split_lines`); tokens are
    split on any Unicode whitespace, as bilm-tf's `str.split()` does. Blank
    lines are skipped unless `keep_empty` (then line i is sentence i, and a
    blank line is a sentence of no tokens). A file in a bucket is read from
    its local copy (`copies.local_copy`: downloaded once, while unchanged)."""
    with open(copies.local_copy(path), "rb") as fh:
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


def lm1b_records(split: str = "train", data_dir: str | None = None):
    """The One Billion Word Benchmark's records (`len` and `[]`) through
    TensorFlow Datasets' random-access `data_source` (optional: `pip install
    tensorflow-datasets`; the dataset must be prepared in TFDS's data dir,
    which needs the network once)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError("the lm1b source needs TensorFlow Datasets: "
                        "pip install tensorflow-datasets") from None
    try:
        # never download: TFDS would fetch lm1b from the open web
        return tfds.data_source("lm1b", split=split, data_dir=data_dir, download=False)
    except Exception as e:  # not prepared, no network, ...
        raise DataError(f"TFDS lm1b ({split}) is not available here: {e}") from None


def lm1b_sentences(split: str = "train", data_dir: str | None = None):
    """Every sentence of lm1b's `split` once, in its order (already tokenised),
    for `streams.TokenCorpus`."""
    records = lm1b_records(split, data_dir)
    for i in range(len(records)):
        text = records[i]["text"]
        yield (text.decode("utf-8") if isinstance(text, bytes) else text).split()
