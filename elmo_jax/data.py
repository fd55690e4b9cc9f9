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

import glob
import os
from typing import Iterator

import numpy as np

from elmo_jax.chars import MAX_CHARS, PAD_CHAR, token_to_char_ids, trim_padding
from elmo_jax.files import split_lines
from elmo_jax.vocab import BOS, EOS, Vocabulary, build_vocab, count_tokens


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
        records = tfds.data_source("lm1b", split=split, data_dir=data_dir)
    except Exception as e:  # not prepared, no network, ...
        raise DataError(f"TFDS lm1b ({split}) is not available here: {e}") from None
    return IndexedSource(records, "text", seed, process_index, process_count, f"lm1b[{split}]")


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

    `source` is a TextSource/IndexedSource (training: never runs dry) or any
    iterable of sentences (evaluation: the last windows are padded and
    `mask` marks the real positions; iteration stops when every row is empty).
    `widest_filter` (the model's, when > 0) cuts each batch's token spellings
    to the characters its CNN needs."""

    def __init__(self, source, vocab: Vocabulary, batch_size: int, unroll_steps: int,
                 max_chars: int = MAX_CHARS, n_groups: int = 1, table_bucket: int = 128,
                 widest_filter: int = 0):
        if batch_size % n_groups:
            raise DataError(f"batch size {batch_size} does not split into {n_groups} groups")
        self.source, self.vocab = source, vocab
        self.B, self.U, self.C = batch_size, unroll_steps, max_chars
        self.S, self.table_bucket, self.widest_filter = n_groups, table_bucket, widest_filter
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
        token_chars, token_index = self._token_tables(tokens, mask)
        return {"token_chars": token_chars, "token_index": token_index,
                "targets": targets, "mask": mask}

    def _token_tables(self, tokens, mask):
        B, U, S = self.B, self.U, self.S
        rows = B // S
        index = np.zeros((2, B, U), np.int32)
        tables = []
        for s in range(S):
            table: dict[str, int] = {}
            for d in range(2):
                for i in range(s * rows, (s + 1) * rows):
                    for t in range(U):
                        if mask[i, t]:
                            index[d, i, t] = table.setdefault(tokens[d][i][t], len(table) + 1)
            tables.append(table)
        n = max(len(t) for t in tables) + 1
        n = -(-n // self.table_bucket) * self.table_bucket  # few shapes, few compilations
        token_chars = np.zeros((S, n, self.C), np.int32)
        for s, table in enumerate(tables):
            for token, k in table.items():
                token_chars[s, k] = self.chars(token)
        if self.widest_filter:
            token_chars = trim_padding(token_chars, self.widest_filter)
        return token_chars, index

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


def _input_worker(out, pattern, words, rows, unroll_steps, max_chars, groups, widest_filter,
                  seed, index, count, position):
    """One input process: a Batcher over its own shards, batches put on `out`
    (a bounded queue: it works ahead by the queue's size) with the position
    after each."""
    try:
        source = TextSource(pattern, seed=seed, process_index=index, process_count=count)
        batcher = Batcher(source, Vocabulary(words), rows, unroll_steps, max_chars,
                          n_groups=groups, widest_filter=widest_filter)
        if position is not None:
            batcher.restore(position)
        while True:
            batch = next(batcher)
            out.put((batch, batcher.position()))
    except Exception as e:  # the main process raises it
        out.put(DataError(f"input worker {index}: {e}"))


class ParallelBatcher:
    """`Batcher`s in `workers` background processes, each preparing the windows
    of its share of the rows (and row groups) ahead of the training step, from
    its own shards: the shards matching `pattern` are split over every worker
    of every process (worker w of process p reads shards p*W + w, + P*W, ...).
    A batch is the workers' parts side by side; its position holds each
    worker's, so a run resumes exactly (with the same number of workers)."""

    def __init__(self, pattern: str, vocab: Vocabulary, batch_size: int, unroll_steps: int,
                 max_chars: int = MAX_CHARS, n_groups: int = 1, workers: int = 2, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, ahead: int = 4,
                 widest_filter: int = 0):
        # each worker makes at least one row group (token table) of its own
        groups = n_groups // workers if n_groups >= workers else 1
        if batch_size % workers or groups * workers % n_groups:
            raise DataError(f"{batch_size} rows in {n_groups} groups do not split over "
                            f"{workers} input workers")
        count = process_count * workers
        shards = list_shards(pattern)
        if len(shards) < count:
            raise DataError(f"{len(shards)} shard(s) matching {pattern!r} cannot feed {count} "
                            f"input workers: split the corpus into at least {count} files")
        self.args = (pattern, vocab.words, batch_size // workers, unroll_steps, max_chars,
                     groups, widest_filter, seed)
        self.first, self.workers, self.count, self.ahead = (process_index * workers, workers,
                                                            count, ahead)
        self.positions: list = [None] * workers
        self._queues, self._procs = None, []

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # the parent may run JAX's threads
        self._queues = [ctx.Queue(maxsize=self.ahead) for _ in range(self.workers)]
        for w, q in enumerate(self._queues):
            p = ctx.Process(target=_input_worker, daemon=True,
                            args=(q, *self.args, self.first + w, self.count, self.positions[w]))
            p.start()
            self._procs.append(p)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._queues is None:
            self._start()
        parts = []
        for w, q in enumerate(self._queues):
            part = self._get(w, q)
            if isinstance(part, Exception):
                self.close()
                raise part
            parts.append(part[0])
            self.positions[w] = part[1]
        n, width = (max(p["token_chars"].shape[k] for p in parts) for k in (1, 2))
        parts = [pad_tables(p, n, width) for p in parts]
        return {"token_chars": np.concatenate([p["token_chars"] for p in parts]),
                "token_index": np.concatenate([p["token_index"] for p in parts], axis=1),
                "targets": np.concatenate([p["targets"] for p in parts], axis=1),
                "mask": np.concatenate([p["mask"] for p in parts])}

    def _get(self, w: int, q):
        """Worker w's next part; an error naming it if it died (a worker killed
        for memory puts nothing on its queue, which would be waited on forever)."""
        import queue

        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                proc = self._procs[w]
                if not proc.is_alive():
                    code = proc.exitcode
                    why = (f"killed by signal {-code}" + (" (out of memory?)" if code == -9 else "")
                           if code < 0 else f"exit code {code}")
                    self.close()
                    return DataError(f"input worker {self.first + w} (pid {proc.pid}) died: "
                                     f"{why}")

    def position(self) -> dict:
        return {"workers": list(self.positions)}

    def restore(self, position: dict) -> None:
        if self._queues is not None:
            raise RuntimeError("restore before the first batch")
        if len(position.get("workers", [])) != self.workers:
            raise DataError(f"the saved data position is of {len(position.get('workers', []))} "
                            f"input workers; this run has {self.workers}: use the same "
                            "train.input_workers to resume")
        self.positions = list(position["workers"])

    def close(self) -> None:
        for p in self._procs:
            p.terminate()
        self._procs, self._queues = [], None


def pad_tables(batch: dict, n: int, width: int | None = None) -> dict:
    """A batch's token tables padded to n rows (all-zero padding tokens) and
    `width` characters (the padding id after each real token's spelling)."""
    chars = batch["token_chars"]
    (S, n0, w0), width = chars.shape, width or chars.shape[2]
    if (n0, w0) == (n, width):
        return batch
    padded = np.zeros((S, n, width), chars.dtype)
    padded[:, :n0, w0:] = np.where(np.any(chars > 0, axis=-1, keepdims=True), PAD_CHAR + 1, 0)
    padded[:, :n0, :w0] = chars
    return {**batch, "token_chars": padded}
