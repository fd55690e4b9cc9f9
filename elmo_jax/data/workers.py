"""Batches made in worker processes (`train.input_workers`): worker w makes
the windows and token tables of its share of this process's row groups with
a `StreamBatcher` of its own, over the same corpus and spelling tables
(memory-mapped from one folder, so every worker shares the page cache), and
puts the unpadded parts on a bounded queue; the parent joins them and pads
the tables (`assemble`). A worker that dies is an error naming it, not a wait.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from elmo_jax.data.sources import DataError
from elmo_jax.data.streams import SpellingTables, StreamBatcher
from elmo_jax.data.tokens import TokenCorpus


def _relay(from_worker, to_main) -> None:
    """Move a worker's parts from its process queue to a thread queue."""
    try:
        while True:
            to_main.put(from_worker.get())
    except (EOFError, OSError, ValueError):  # the queue was closed
        return


def _input_worker(out, folder, kwargs, position):
    """One input process: its rows' parts, each with its rows' position after it."""
    try:
        corpus = TokenCorpus.load(os.path.join(folder, "corpus"))
        tables = SpellingTables.load(folder, kwargs["max_chars"])
        batcher = StreamBatcher(corpus, None, tables=tables, **kwargs)
        batcher.restore(position)
        while True:
            parts = batcher.next_parts()
            out.put((parts, batcher.position()))
    except Exception as e:  # the parent raises it
        out.put(DataError(f"input worker: {e}"))


class ParallelStreamBatcher:
    """A `StreamBatcher` whose batches are made by `workers` processes, each
    over a block of the row groups; the same batches, the same position."""

    def __init__(self, batcher: StreamBatcher, workers: int, ahead: int = 4):
        self._queues, self._procs, self.folder = None, [], None
        groups = len(batcher.rows) // batcher.per_group
        if workers < 1 or groups % workers:
            raise DataError(f"this process's {groups} row groups (one a device) do not split "
                            f"over {workers} input workers: use a divisor of {groups}")
        self.batcher, self.shapes = batcher, batcher.shapes
        self.workers, self.ahead = workers, ahead
        self.folder = tempfile.mkdtemp(prefix="elmo-jax-input-")
        corpus = batcher.corpus
        if corpus.source_folder is None:
            corpus.save(os.path.join(self.folder, "corpus"))
        else:
            os.symlink(os.path.abspath(corpus.source_folder), os.path.join(self.folder, "corpus"))
        batcher.tables.save(self.folder)
        rows = np.array_split(batcher.rows, workers)
        self.kwargs = [dict(batch_size=batcher.B, unroll_steps=batcher.U,
                            max_chars=batcher.tables.max_chars, n_groups=batcher.S,
                            rows=(int(r[0]), int(r[-1]) + 1), seed=batcher.seed,
                            shapes=batcher.shapes) for r in rows]
        self.sizes = [len(r) for r in rows]
        self.restore(batcher.position())

    # -- position: the workers' rows' cursors, one after another ----------------
    def position(self) -> dict:
        return {"batches": self.batches, "cursors": np.concatenate(self.cursors)}

    def restore(self, position: dict) -> None:
        self.close()
        self.batcher.restore(position)  # finds cursors that were not saved
        full = self.batcher.position()
        bounds = np.cumsum([0] + self.sizes)
        self.batches = full["batches"]
        self.cursors = [full["cursors"][a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _start(self) -> None:
        import multiprocessing
        import queue
        import threading

        ctx = multiprocessing.get_context("spawn")  # the parent runs JAX's threads
        self._queues = [queue.Queue(maxsize=1) for _ in range(self.workers)]
        for w, q in enumerate(self._queues):
            from_worker = ctx.Queue(maxsize=self.ahead)
            p = ctx.Process(target=_input_worker, daemon=True,
                            args=(from_worker, self.folder, self.kwargs[w],
                                  {"batches": self.batches, "cursors": self.cursors[w]}))
            p.start()
            self._procs.append(p)
            # A worker killed while it writes leaves half a message in the pipe, and a
            # read of it would never return: the reads happen in a thread, and `_get`
            # waits on the thread's queue with a timeout, watching the worker.
            threading.Thread(target=_relay, args=(from_worker, q), daemon=True).start()

    def next_parts(self) -> dict:
        if self._queues is None:
            self._start()
        parts = []
        for w, q in enumerate(self._queues):
            part = self._get(w, q)
            if isinstance(part, Exception):
                self.close()
                raise part
            parts.append(part[0])
            self.cursors[w] = part[1]["cursors"]
        self.batches += 1
        return {"spellings": np.concatenate([p["spellings"] for p in parts]),
                "counts": np.concatenate([p["counts"] for p in parts]),
                "token_index": np.concatenate([p["token_index"] for p in parts], axis=1),
                "targets": np.concatenate([p["targets"] for p in parts], axis=1),
                "mask": np.concatenate([p["mask"] for p in parts]),
                "need": tuple(max(p["need"][k] for p in parts) for k in range(2))}

    def assemble(self, parts: dict, need=None) -> dict:
        return self.batcher.assemble(parts, need)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return self.assemble(self.next_parts())

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
                    return DataError(f"input worker {w} (pid {proc.pid}) died: {why}")

    def close(self) -> None:
        for p in self._procs:
            p.terminate()
        self._procs, self._queues = [], None

    def __del__(self):
        self.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
