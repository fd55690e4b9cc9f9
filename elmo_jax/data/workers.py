"""Batches made ahead in worker processes (`train.input_workers`): each worker
runs a `Batcher` over its own shards and puts its part of every batch on a
bounded queue; a worker that dies is an error naming it, not a wait.
"""
from __future__ import annotations

import numpy as np

from elmo_jax.chars import MAX_CHARS
from elmo_jax.data.batches import Batcher, pad_tables
from elmo_jax.data.sources import DataError, TextSource, list_shards
from elmo_jax.vocab import Vocabulary


def _relay(from_worker, to_main) -> None:
    """Move a worker's batches from its process queue to a thread queue."""
    try:
        while True:
            to_main.put(from_worker.get())
    except (EOFError, OSError, ValueError):  # the queue was closed
        return


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
        import queue
        import threading

        ctx = multiprocessing.get_context("spawn")  # the parent may run JAX's threads
        self._queues = [queue.Queue(maxsize=1) for _ in range(self.workers)]
        for w, q in enumerate(self._queues):
            from_worker = ctx.Queue(maxsize=self.ahead)
            p = ctx.Process(target=_input_worker, daemon=True,
                            args=(from_worker, *self.args, self.first + w, self.count,
                                  self.positions[w]))
            p.start()
            self._procs.append(p)
            # A worker killed while it writes a batch leaves half a message in the pipe,
            # and a read of it would never return: the reads happen in a thread, and
            # `_get` waits on the thread's queue with a timeout, watching the worker.
            threading.Thread(target=_relay, args=(from_worker, q), daemon=True).start()

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
