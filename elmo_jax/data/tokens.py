"""A corpus as token ids (`TokenCorpus`): every sentence as spelling ids,
`<S> w1 .. wn </S>` one after another, made once from text (`train.py
prepare` writes it as memory-mapped numpy; raw text is prepared in memory at
the start of a run). A spelling is the token as written (out-of-vocabulary
ones included: the character CNN reads the real word while the softmax's
target is `<UNK>`). Batches are cut from it by `streams.StreamBatcher`."""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from elmo_jax.storage import copies, paths
from elmo_jax.data.sources import DataError, list_shards, read_sentences
from elmo_jax.storage.files import write_json, write_text
from elmo_jax.core.vocab import BOS, EOS

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # spelling ids; the corpus' own spellings follow
CORPUS_FILE = "corpus.json"       # marks a prepared corpus folder
FORMAT = "elmo-jax-token-corpus-1"


class TokenCorpus:
    """Sentences as spelling ids.

        spellings [K] str   id -> token as written (0 padding, 1 `<S>`, 2 `</S>`)
        tokens    [T] int32 each sentence as <S> w1 .. wn </S>, one after another
        starts    [N] int64 where sentence i's <S> is in `tokens`
        lengths   [N] int32 its n (>= 1: blank lines are not sentences)
    """

    def __init__(self, spellings: list[str], tokens: np.ndarray, starts: np.ndarray,
                 lengths: np.ndarray, files: list[str] | None = None, what: str = "training"):
        if len(starts) == 0:  # `what` names the corpus in the error: "training", "held-out"
            where = ", ".join(files) if files else f"the {what} text"
            raise DataError(f"no {what} sentences in {where}: the corpus is empty")
        self.spellings, self.tokens, self.starts, self.lengths = spellings, tokens, starts, lengths
        self.files = files or []
        self.source_folder: str | None = None  # the prepared folder it was loaded from

    def __len__(self) -> int:
        return len(self.starts)

    def fingerprint(self) -> str:
        """What tells this corpus from another in one line: its files (names
        and sizes), its sentences and tokens, and a hash of every sentence's
        length and of the spelled tokens of 1000 sentences spread over it (the
        order every process reads its rows of)."""
        h = hashlib.sha1(np.ascontiguousarray(self.lengths, np.int32).tobytes())
        for i in np.unique(np.linspace(0, len(self) - 1, num=min(len(self), 1000)).astype(int)):
            start = int(self.starts[i])
            ids = self.tokens[start:start + int(self.lengths[i]) + 2]
            h.update(" ".join(self.spellings[t] for t in ids).encode("utf-8") + b"\n")
        sizes = []
        for f in self.files:
            try:
                sizes.append(f"{paths.basename(f)} ({paths.size(f)} B)")
            except OSError:
                sizes.append(paths.basename(f))
        files = ", ".join(sizes[:4]) + (f" and {len(sizes) - 4} more" if len(sizes) > 4 else "")
        h.update(files.encode("utf-8") + " ".join(sizes).encode("utf-8"))
        return (f"{len(self.files)} file(s) [{files}], {len(self)} sentences, "
                f"{int(self.lengths.sum())} tokens, #{h.hexdigest()[:12]}")

    @classmethod
    def from_sentences(cls, sentences, files=None, what: str = "training") -> "TokenCorpus":
        """From an iterable of token lists (empty ones skipped)."""
        ids = {"": PAD_ID, BOS: BOS_ID, EOS: EOS_ID}
        chunks, lengths = [], []
        for sentence in sentences:
            if not sentence:
                continue
            chunks.append([BOS_ID, *(ids.setdefault(w, len(ids)) for w in sentence), EOS_ID])
            lengths.append(len(sentence))
        lengths = np.asarray(lengths, np.int32)
        starts = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) + 2, out=starts[1:])
        tokens = np.fromiter((t for c in chunks for t in c), np.int32,
                             count=int(lengths.sum()) + 2 * len(lengths))
        spellings = [""] * len(ids)
        for w, i in ids.items():
            spellings[i] = w
        return cls(spellings, tokens, starts, lengths, files, what)

    @classmethod
    def from_files(cls, pattern: str, what: str = "training") -> "TokenCorpus":
        """Text shards (sentence per line, read as bilm-tf reads them), in
        sorted order."""
        files = list_shards(pattern)
        copies.local_copies(files)  # a bucket's shards downloaded together, ahead of reading
        return cls.from_sentences((s for p in files for s in read_sentences(p)), files, what)

    def save(self, out_dir: str) -> dict:
        """As memory-mappable numpy arrays in `out_dir`, a local folder or a
        bucket prefix (each file written whole; the record last, so that a
        folder without it is not a prepared corpus)."""
        paths.makedirs(out_dir)
        for name in ("tokens", "starts", "lengths"):
            with paths.atomic_path(paths.join(out_dir, f"{name}.npy")) as tmp, \
                    open(tmp, "wb") as fh:
                np.save(fh, getattr(self, name))
        write_text(paths.join(out_dir, "spellings.txt"), "\n".join(self.spellings[3:]) + "\n")
        record = {"format": FORMAT, "sentences": len(self), "tokens": int(self.lengths.sum()),
                  "spellings": len(self.spellings) - 3, "files": self.files}
        write_json(paths.join(out_dir, CORPUS_FILE), record)  # last: marks it whole
        return record

    @classmethod
    def load(cls, folder: str) -> "TokenCorpus":
        """A prepared folder, its arrays memory-mapped."""
        try:
            with open(os.path.join(folder, CORPUS_FILE), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError) as e:
            raise DataError(f"{folder} is not a prepared corpus ({CORPUS_FILE}: {e}); "
                            "make one with `train.py prepare`") from None
        if record.get("format") != FORMAT:
            raise DataError(f"{folder} holds a corpus of format {record.get('format')!r}; this "
                            f"version reads {FORMAT!r}: prepare it again")
        arrays = {n: np.load(os.path.join(folder, f"{n}.npy"), mmap_mode="r")
                  for n in ("tokens", "starts", "lengths")}
        with open(os.path.join(folder, "spellings.txt"), encoding="utf-8") as fh:
            words = fh.read().split("\n")[:record["spellings"]]
        corpus = cls(["", BOS, EOS, *words], files=record.get("files"), **arrays)
        corpus.source_folder = folder
        return corpus


def is_prepared(path: str | None) -> bool:
    return bool(path) and paths.isfile(paths.join(path, CORPUS_FILE))


def open_corpus(train_files: str) -> TokenCorpus:
    """A prepared folder (memory-mapped; one in a bucket from its local copy)
    or a glob of text shards (prepared in memory)."""
    if is_prepared(train_files):
        return TokenCorpus.load(copies.local_copy_tree(train_files))
    return TokenCorpus.from_files(train_files)


def prepare(pattern: str, out_dir: str) -> dict:
    """`train.py prepare`: text shards -> a prepared corpus folder."""
    t0 = time.time()
    record = TokenCorpus.from_files(pattern).save(out_dir)
    return {**record, "out_dir": out_dir, "seconds": round(time.time() - t0, 1)}
