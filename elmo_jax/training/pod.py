"""What holds a run of several processes together: they meet within a stated
time, one failure or a silent peer stops them all with an error line, and
they share one workdir, one corpus, one vocabulary and one config.

`initialize` starts `jax.distributed` and says every 30 s that it is waiting
for the others, giving up at `wait_for_peers` seconds (status 2). An error on
any one process ends every process within seconds, each naming the cause
(`failures_stop_every_process`). Without it the others would wait forever: in
the next collective (the step's all-reduce, `global_batch`'s gather), and the
failed process itself in `jax.distributed`'s shutdown barrier at exit, which
waits for all. So a failing process stores its message in the coordination
service's key-value store and leaves at once (`os._exit`, past that barrier);
every process runs a watcher thread that reads the store each second and
leaves, naming the failed process and its message, as soon as another's
appears. The same thread counts up a key of its own each second: a peer whose
count stays still for `heartbeat_timeout` seconds (stopped, its host gone)
ends the survivors with a line naming it and how long they waited, before
jax's own heartbeat (set later) would abort them from C++. A coordinator
(process 0) that dies outright ends the others in C++ at once;
`elmo_jax.cli.supervise`, the parent of each training process, turns that
abort into the same line.
Before training the processes check that they share the workdir and its
newest checkpoint (`agree_on_the_workdir`) and the facts of the run
(`agree_on_the_run`).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import select
import signal
import sys
import threading
import time
import traceback

import jax
import numpy as np
from jax.experimental import multihost_utils

from elmo_jax import environment
from elmo_jax.config import HEARTBEAT_TIMEOUT, WAIT_FOR_PEERS
from elmo_jax.storage import paths
from elmo_jax.storage.files import write_text

KEY = "elmo_jax/failed/"
ALIVE = "elmo_jax/alive/"
POLL_SECONDS = 1.0
JAX_MARGIN = 60            # jax's own timeouts come this much later than ours
_SETTINGS = {"heartbeat_timeout": HEARTBEAT_TIMEOUT}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
               wait_for_peers: float = WAIT_FOR_PEERS, keep_a_signal: bool = False,
               kept: signal.Signals | None = None) -> signal.Signals | None:
    """`jax.distributed.initialize` (None: the cluster from the environment),
    saying every 30 s (a third of `wait_for_peers` when shorter) that it waits
    for the others, and leaving with status 2 and an error line after
    `wait_for_peers` seconds. A SIGINT or SIGTERM meanwhile ends the process at
    once; with `keep_a_signal` (training: `stopping.catch_signals_now`) the
    first, or `kept` (one that came before), is kept for the stop before step
    1 and a second ends it: returns the first that came while waiting, when
    none was `kept`, for the caller to keep (`stopping.keep_signal`).
    `heartbeat_timeout`: how long a silent peer is waited for once running
    (`failures_stop_every_process`)."""
    if heartbeat_timeout <= 0 or wait_for_peers <= 0:
        raise ValueError("--heartbeat_timeout and --wait_for_peers must be positive")
    _SETTINGS["heartbeat_timeout"] = float(heartbeat_timeout)
    who = f"process {process_id if process_id is not None else '?'} of {num_processes or '?'}"
    where = coordinator_address or "the cluster's coordinator"
    met = threading.Event()
    # the main thread waits in C++, where Python's handlers cannot run: a signal
    # reaches the thread below through a wakeup fd (its handler here does nothing)
    kept = kept if keep_a_signal else None
    signals = [kept] if kept else []  # signal.Signals, in the order they came
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    previous = signal.set_wakeup_fd(wake_w)
    handlers = {sig: signal.signal(sig, lambda signum, frame: None)
                for sig in (signal.SIGINT, signal.SIGTERM)}

    def read_signals(timeout):
        if select.select([wake_r], [], [], timeout)[0]:
            signals.extend(signal.Signals(b) for b in os.read(wake_r, 64)
                           if b in (signal.SIGINT, signal.SIGTERM))  # not the 0 of the end

    thread = threading.Thread(target=_wait_and_say, daemon=True, name="elmo-jax-wait-for-peers",
                              args=(met, signals, read_signals, who, where, wait_for_peers,
                                    num_processes, keep_a_signal))
    thread.start()
    try:
        jax.distributed.initialize(
            coordinator_address, num_processes, process_id,
            initialization_timeout=int(wait_for_peers) + JAX_MARGIN,
            heartbeat_timeout_seconds=int(heartbeat_timeout) + JAX_MARGIN)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous)
        met.set()
        os.write(wake_w, b"\0")  # the thread's select returns now, not at its timeout
        thread.join()
        read_signals(0)  # one that came as the wait ended
        os.close(wake_r)
        os.close(wake_w)
    return signals[0] if keep_a_signal and signals and not kept else None


def _wait_and_say(met, signals, read_signals, who, where, wait_for_peers, num_processes,
                  keep_a_signal) -> None:
    """`initialize`'s watcher: every so often a line that this process waits,
    a signal kept or ending the process, and the end after `wait_for_peers`."""
    t0, every = time.time(), min(30.0, max(wait_for_peers / 3, 1.0))
    said, told = t0, 0
    while not met.is_set():
        if len(signals) > told:
            told = len(signals)
            if told >= (2 if keep_a_signal else 1):
                sys.stderr.write(f"{who}: stopped by {signals[-1].name} while waiting for "
                                 f"the other processes at {where}: nothing was started\n")
                sys.stderr.flush()
                os._exit(128 + signals[-1])
            sys.stderr.write(f"{who}: {signals[0].name} kept while waiting for the other "
                             "processes: every process stops before step 1 once all have "
                             "joined; another SIGINT or SIGTERM ends this one now\n")
            sys.stderr.flush()
        waited = time.time() - t0
        if waited >= wait_for_peers - 1e-3:
            _leave(f"{who} waited {waited:.0f} s for every process to join at {where} and "
                   f"gives up (--wait_for_peers {wait_for_peers:g}): start all "
                   f"{num_processes or ''} processes with the same --coordinator_address "
                   "and --num_processes, process 0 where that address points, or allow "
                   "longer")
        if time.time() - said >= every:
            said = time.time()
            sys.stderr.write(f"{who}: waiting for the other processes at {where} "
                             f"({waited:.0f} s of at most {wait_for_peers:g} s)\n")
            sys.stderr.flush()
        read_signals(0.2)


def _client():
    from jax._src import distributed  # the coordination service's client (orbax uses it too)

    return distributed.global_state.client


def _leave(message: str, details: str = "") -> None:
    """Exit with status 2: `error: ` before each line of `message` (an error of
    several faults, or with its way out, has a line each), then `details`."""
    sys.stderr.write("".join(f"error: {line}\n" for line in message.splitlines()) + details)
    sys.stderr.flush()
    os._exit(2)


def _who() -> str:
    return f"process {jax.process_index()} of {jax.process_count()}"


def _say_whom_we_heard(heard: dict, now: float) -> None:
    """For `supervise`: when this process last heard each peer (a file it reads
    if jax aborts this one)."""
    path = environment.peers_file()
    if path:
        try:
            write_text(path, json.dumps({"now": now, "heard": heard, "who": _who()}))
        except OSError:
            pass


def _watch(client, finished: threading.Event, answered: list) -> None:
    """Each second: leave if another process failed or a peer went silent;
    count this process's own key up."""
    me, timeout = jax.process_index(), _SETTINGS["heartbeat_timeout"]
    counts: dict = {}  # peer -> (its count, when it last changed)
    for beat in itertools.count():
        if finished.wait(POLL_SECONDS):
            return
        try:
            client.key_value_set(f"{ALIVE}{me}", str(beat), allow_overwrite=True)
            failed = [(k.rsplit("/", 1)[-1], v) for k, v in client.key_value_dir_get(KEY)]
            alive = dict((k.rsplit("/", 1)[-1], v) for k, v in client.key_value_dir_get(ALIVE))
        except Exception as e:  # the store lives in process 0
            if not finished.is_set():
                _leave(f"{_who()} stopped: lost the coordinator (process 0): {e}")
            return
        now = answered[0] = time.time()
        for who, message in failed:
            if who != str(me):
                _leave(f"{_who()} stopped because process {who} failed: {message}")
        for p in range(jax.process_count()):
            if p == me:
                continue
            value = alive.get(str(p))
            if value is not None and counts.get(p, (None,))[0] != value:
                counts[p] = (value, now)
            since = counts.setdefault(p, (None, now))[1]
            if now - since > timeout and not finished.is_set():
                _leave(f"{_who()} stopped: process {p} has not been heard from for "
                       f"{now - since:.0f} s (--heartbeat_timeout {timeout:g}): it stalled, or "
                       "its host is gone. Resume with the same command on every host")
        _say_whom_we_heard({str(p): t for p, (_, t) in counts.items()}, now)


def _watch_the_watcher(finished: threading.Event, answered: list) -> None:
    """The coordinator stopped (not dead): the watcher's calls hang; leave
    once it has gone unanswered for the heartbeat timeout."""
    timeout = _SETTINGS["heartbeat_timeout"]
    while not finished.wait(POLL_SECONDS):
        if time.time() - answered[0] > timeout:
            _leave(f"{_who()} stopped: the coordinator (process 0) has not answered for "
                   f"{time.time() - answered[0]:.0f} s (--heartbeat_timeout {timeout:g}): it "
                   "stalled, or its host is gone. Resume with the same command on every host")


@contextlib.contextmanager
def failures_stop_every_process():
    """Around a multi-process run (nothing happens in a single process): watch
    for the others' failures; on an exception here, tell them and leave with
    status 2, the message first (and the traceback, unless it is a user's
    mistake: an `errors.UserError`)."""
    if jax.process_count() == 1:
        yield
        return
    client, finished, answered = _client(), threading.Event(), [time.time()]
    atexit.register(finished.set)  # before jax.distributed's own shutdown (atexit is LIFO)
    threading.Thread(target=_watch, args=(client, finished, answered), daemon=True,
                     name="elmo-jax-failure-watch").start()
    threading.Thread(target=_watch_the_watcher, args=(finished, answered), daemon=True,
                     name="elmo-jax-watch-the-watcher").start()
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__  # every line
        try:
            client.key_value_set(f"{KEY}{jax.process_index()}", message)
        except Exception:
            pass
        if jax.process_index() == 0:  # keep the store up until the others have read it
            time.sleep(3 * POLL_SECONDS)
        finished.set()
        from elmo_jax.errors import UserError  # a user's mistake: its line, as alone

        _leave(f"{_who()}: {message}",
               "" if isinstance(e, UserError) else traceback.format_exc())
    finally:
        finished.set()


def finish_together() -> None:
    """The end of a run of several processes, everything written: wait until
    every process is here, then leave a mark for `supervise`. jax's teardown at
    exit (gloo's connections, the coordination service going down with process
    0) can still abort a process from C++ when a peer leaves first; by then
    the run is complete on every process, and `supervise` says so."""
    if jax.process_count() == 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    timeout = _SETTINGS["heartbeat_timeout"]
    try:
        _client().wait_at_barrier("elmo_jax/finished", int(timeout * 1000))
    except Exception as e:
        _leave(f"{_who()} finished, but not every process did within {timeout:g} s "
               f"(--heartbeat_timeout): {str(e).splitlines()[0] if str(e) else e!r}")
    path = environment.peers_file()
    if path:
        with open(path + environment.FINISHED_SUFFIX, "w"):
            pass


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
    path = paths.join(workdir, ".shared_by_every_process")
    if jax.process_index() == 0:
        write_text(path, str(token))
    multihost_utils.sync_global_devices("elmo_jax: workdir token written")
    try:
        seen = int(paths.read_text(path).strip() or 0) == token
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


def differences(facts: list[dict]) -> list[str]:
    """What differs between the processes' `facts` (process order): one
    "NAME: process(es) P has A, process(es) Q has B" a fact."""
    out = []
    for name in sorted(set().union(*facts)):
        groups: dict = {}
        for p, f in enumerate(facts):
            groups.setdefault(str(f.get(name, "nothing")), []).append(p)
        if len(groups) > 1:
            out.append(f"{name}: " + ", ".join(
                f"process{'es' if len(ps) > 1 else ''} {', '.join(map(str, ps))} "
                f"{'have' if len(ps) > 1 else 'has'} {v}" for v, ps in groups.items()))
    return out


def agree_on_the_run(facts: dict) -> None:
    """Every process must train one run: its `facts` (the corpus's fingerprint,
    the vocabulary's, each config setting; name -> str) are compared across the
    processes, through the key-value store (no device program: it runs before
    anything compiles); any difference is one TrainingError on every process,
    naming the processes and each fact that differs."""
    if jax.process_count() == 1:
        return
    from elmo_jax.training.workdir import TrainingError

    every = [json.loads(v) for v in exchange("run-facts", json.dumps(facts, sort_keys=True))]
    problems = differences(every)
    if problems:
        raise TrainingError("the processes were not given the same run, so nothing was trained "
                            "or written: " + "; ".join(problems) + ". Give every process the "
                            "same files, vocabulary and settings")


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
