"""What holds a run of several processes together: one failure stops them
all, and they share one workdir and resume from one step.

An error on any one process ends every process within seconds, each naming
the cause (`failures_stop_every_process`). Without it the others would wait
forever: in the next collective (the step's all-reduce, `global_batch`'s
gather), and the failed process itself in `jax.distributed`'s shutdown barrier
at exit, which waits for all. So a failing process stores its message in the
coordination service's key-value store and leaves at once (`os._exit`, past
that barrier); every process runs a watcher thread that reads the store each
second and leaves, naming the failed process and its message, as soon as
another's appears (or when the coordinator, process 0, is gone). A process
killed outright (out of memory) cannot tell the others: then jax.distributed's
heartbeat timeout ends them. Before training, the processes check that they
share the workdir and its newest checkpoint (`agree_on_the_workdir`).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
import time
import traceback

import jax
import numpy as np
from jax.experimental import multihost_utils

KEY = "elmo_jax/failed/"
POLL_SECONDS = 1.0


def _client():
    from jax._src import distributed  # the coordination service's client (orbax uses it too)

    return distributed.global_state.client


def _leave(message: str, details: str = "") -> None:
    sys.stderr.write(f"error: {message}\n{details}")
    sys.stderr.flush()
    os._exit(2)


def _who() -> str:
    return f"process {jax.process_index()} of {jax.process_count()}"


def _watch(client, finished: threading.Event) -> None:
    me = str(jax.process_index())
    while not finished.wait(POLL_SECONDS):
        try:
            failed = [(k.rsplit("/", 1)[-1], v) for k, v in client.key_value_dir_get(KEY)]
        except Exception as e:  # the store lives in process 0
            if not finished.is_set():
                _leave(f"{_who()} stopped: lost the coordinator (process 0): {e}")
            return
        for who, message in failed:
            if who != me:
                _leave(f"{_who()} stopped because process {who} failed: {message}")


@contextlib.contextmanager
def failures_stop_every_process():
    """Around a multi-process run (nothing happens in a single process): watch
    for the others' failures; on an exception here, tell them and leave with
    status 2, the message first."""
    if jax.process_count() == 1:
        yield
        return
    client, finished = _client(), threading.Event()
    atexit.register(finished.set)  # before jax.distributed's own shutdown (atexit is LIFO)
    threading.Thread(target=_watch, args=(client, finished), daemon=True,
                     name="elmo-jax-failure-watch").start()
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        message = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        try:
            client.key_value_set(f"{KEY}{jax.process_index()}", message)
        except Exception:
            pass
        if jax.process_index() == 0:  # keep the store up until the others have read it
            time.sleep(3 * POLL_SECONDS)
        finished.set()
        _leave(f"{_who()}: {message}", traceback.format_exc())
    finally:
        finished.set()


def agree_on_the_workdir(workdir: str, resume_step: int | None) -> None:
    """Every process must see one workdir (process 0 writes a token there that
    all must read back) and the same newest checkpoint; otherwise one process
    would restore and another start afresh. A clear error on every process, not a
    hang in the first checkpoint's save."""
    if jax.process_count() == 1:
        return
    from elmo_jax.training.workdir import TrainingError

    token = int(multihost_utils.broadcast_one_to_all(
        np.array(np.random.default_rng().integers(1, 2**31), np.int32)))
    path = os.path.join(workdir, ".shared_by_every_process")
    if jax.process_index() == 0:
        with open(path, "w") as fh:
            fh.write(str(token))
    multihost_utils.sync_global_devices("elmo_jax: workdir token written")
    try:
        with open(path) as fh:
            seen = int(fh.read().strip() or 0) == token
    except (OSError, ValueError):
        seen = False
    step = -1 if resume_step is None else resume_step
    every = multihost_utils.process_allgather(np.array([int(seen), step], np.int64)).reshape(-1, 2)
    blind = [i for i, (ok, _) in enumerate(every) if not ok]
    if blind:
        raise TrainingError(f"process(es) {', '.join(map(str, blind))} do not see the workdir "
                            f"{workdir} that process 0 writes: a run of several processes needs "
                            "one workdir shared by every host (a network or bucket path)")
    steps = sorted({int(s) for _, s in every})
    if len(steps) > 1:
        raise TrainingError(f"the processes see different newest checkpoints in {workdir} "
                            f"(steps {', '.join('none' if s < 0 else str(s) for s in steps)}): "
                            "wait for the shared folder to settle, or remove the partial step")


_EXCHANGED: list[str] = []  # this process's keys, deleted once every process has read them


def exchange(name: str, value: str, timeout_s: float = 600.0) -> list[str]:
    """Every process's `value` for `name`, in process order, through the
    coordination service's key-value store (no device program, no barrier
    but this one). Every process must call it with the same names in the same
    order."""
    client, me = _client(), jax.process_index()
    key = f"elmo_jax/x/{name}/"
    client.key_value_set(key + str(me), value)
    _EXCHANGED.append(key + str(me))
    out = [value if p == me else client.blocking_key_value_get(key + str(p), int(timeout_s * 1e3))
           for p in range(jax.process_count())]
    while len(_EXCHANGED) > 64:  # long read by all: any process is within a few of the others
        try:
            client.key_value_delete(_EXCHANGED.pop(0))
        except Exception:
            pass
    return out


class Decisions:
    """When every process stops, and when it saves a checkpoint by wall time,
    decided without a collective in the step loop. One process alone decides
    at once. Several: every `cadence` steps each process looks up (without
    waiting) what has been decided; a process that wants to stop (a signal, its
    time limit) proposes a step `2 * cadence` ahead, and the first proposal
    stored wins (process 0's clock alone proposes the timed saves). The
    processes' loops stay within a few steps of each other (each waits for the
    step two back), so every process learns the step before it reaches it."""

    _runs = itertools.count()

    def __init__(self, cadence: int = 10):
        self.cadence, self.run = cadence, next(self._runs)
        self.stop_at: tuple[int, str] | None = None
        self.save_at: int | None = None
        self.saves = 0  # timed saves done (the same count on every process)

    def _key(self, what: str) -> str:
        return f"elmo_jax/decide/{self.run}/{what}"

    def _propose(self, what: str, value: str) -> None:
        try:
            _client().key_value_set(self._key(what), value)  # refused when one is there
        except Exception:
            pass

    def _look_up(self, what: str) -> str | None:
        try:
            return _client().key_value_try_get(self._key(what))
        except Exception:  # not there (yet)
            return None

    def poll(self, step: int, stop_reason: str | None, save_due: bool
             ) -> tuple[str | None, bool]:
        """At the end of `step`: (why every process stops now, or None;
        whether every process saves now)."""
        if jax.process_count() == 1:
            return stop_reason, save_due
        if step % self.cadence == 0:
            if stop_reason and self.stop_at is None:
                self._propose("stop", f"{step + 2 * self.cadence}:{jax.process_index()}:"
                              f"{stop_reason}")
            if save_due and jax.process_index() == 0 and self.save_at is None:
                self._propose(f"save/{self.saves}", str(step + 2 * self.cadence))
            if self.stop_at is None and (found := self._look_up("stop")):
                at, who, why = found.split(":", 2)
                self.stop_at = (int(at), why if int(who) == jax.process_index()
                                else f"process {who}: {why}")
            if self.save_at is None and (found := self._look_up(f"save/{self.saves}")):
                self.save_at = int(found)
        for what, at in (("stop", self.stop_at and self.stop_at[0]), ("save", self.save_at)):
            if at is not None and step > at:
                raise RuntimeError(f"process {jax.process_index()} learnt of the {what} at step "
                                   f"{at} only at step {step}: the processes drifted apart")
        save = self.save_at == step
        if save:
            self.save_at, self.saves = None, self.saves + 1
        if self.stop_at is not None and self.stop_at[0] == step:
            return self.stop_at[1], save
        return None, save
