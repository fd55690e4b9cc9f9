"""Batches on the devices before the step asks: a producer thread makes the
host batches (`data.StreamBatcher`), agrees their table shapes with the other
processes a block of batches at a time (through the coordination service's
key-value store, never a device collective), places them on the mesh
(`jax.make_array_from_process_local_data`) and keeps `ahead` of them waiting.

Each batch carries its number (batches are counted from the run's start, the
ones passed over after a non-finite loss included) and the data position after
it, which a checkpoint of the step that used it stores.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading

import jax
import numpy as np

from elmo_jax.training.partitioning import batch_shardings
from elmo_jax.training.pod import exchange

_GENERATIONS = itertools.count()  # one per feeder made: keys of restarted feeders never meet


class Placed:
    """One global batch on the devices."""

    def __init__(self, arrays: dict, number: int, position: dict, tokens: int):
        self.arrays, self.number = arrays, number
        self.position, self.tokens = position, tokens


class Feeder:
    """The batches after `batcher`'s position, numbered on from `count`, those
    in `skip` made and passed over, placed over `mesh` `ahead` at a time."""

    def __init__(self, batcher, mesh, count: int, skip=frozenset(), ahead: int = 2,
                 block: int = 16):
        self.batcher, self.mesh, self.count = batcher, mesh, count
        # one process needs no agreement: a block of one
        self.skip, self.block = set(skip), block if jax.process_count() > 1 else 1
        self.shardings = batch_shardings(mesh)
        self.generation = next(_GENERATIONS)
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, daemon=True,
                                        name="elmo-jax-feeder")
        self._thread.start()

    def _produce(self) -> None:
        """Make, agree, place: a block is agreed once made whole, and while its
        batches are placed one by one the next block is made one batch after
        each placement, so no block is made in one burst while the devices wait."""
        made, agreed = collections.deque(), collections.deque()
        try:
            while not self._stop.is_set():
                if not agreed:
                    while len(made) < self.block:
                        made.append(self._make())
                    block = [made.popleft() for _ in range(self.block)]
                    needs = self._agree([parts["need"] for parts, _, _ in block], block[0][1])
                    agreed.extend(zip(block, needs))
                (parts, number, position), need = agreed.popleft()
                host = self.batcher.assemble(parts, need)
                arrays = {k: jax.make_array_from_process_local_data(self.shardings[k], v)
                          for k, v in host.items()}
                tokens = int(parts["mask"].sum()) * jax.process_count()
                self._put(Placed(arrays, number, position, tokens))
                if len(made) < self.block:
                    made.append(self._make())
        except BaseException as e:  # the step loop raises it
            self._put(e)

    def _make(self) -> tuple[dict, int, dict]:
        """The next batch to use (past those in `skip`): (parts, number, position)."""
        while True:
            parts = self.batcher.next_parts()
            self.count += 1
            if self.count not in self.skip:
                return parts, self.count, self.batcher.position()

    def _agree(self, needs: list, first: int) -> list:
        """Each batch's shape: the largest any process needs for it."""
        if jax.process_count() == 1:
            return needs
        every = exchange(f"shapes/{self.generation}/{first}",
                         ";".join(f"{a},{b}" for a, b in needs))
        table = np.array([[[int(x) for x in n.split(",")] for n in v.split(";")] for v in every])
        return [tuple(int(x) for x in row) for row in table.max(axis=0)]

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def next(self) -> Placed:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the input thread stopped without an error") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # one blocked in an exchange is a daemon: left
