"""When a run stops, and when it saves by wall time: SIGINT or SIGTERM, the
time limit, `train.checkpoint_every_seconds`, decided by every process alike
(`pod.Decisions`). A signal is caught from the moment training is called: one
during start-up (compiling, restoring: minutes on a pod) stops every process
just before step 1."""
from __future__ import annotations

import contextlib
import itertools
import signal
import time

import jax

from elmo_jax.config import TrainConfig
from elmo_jax.training.pod import Decisions, exchange
from elmo_jax.training.reporting import say

_EXCHANGES = itertools.count()  # names each exchange of this module's (all processes alike)
_EARLY: dict = {"signal": None, "handlers": {}}  # a signal before training was called


def catch_signals_now() -> None:
    """From now on a SIGINT or SIGTERM is kept for the run to stop on before
    step 1 (`stop_requests` starts from it). The CLI calls it first, and again
    after `jax.distributed.initialize`, whose preemption notifier takes SIGTERM
    over from Python and swallows it. Under `supervise` the process starts
    with SIGINT and SIGTERM blocked: one that came since is pending, and is
    kept here once they are unblocked."""
    def early(signum, frame):
        _EARLY["signal"], _EARLY["at"] = signum, time.time()
        signal.signal(signum, _EARLY["handlers"][signum])  # a second one acts as usual

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            before = signal.signal(sig, early)
        except ValueError:  # not the main thread
            continue
        _EARLY["handlers"].setdefault(sig, before if before is not early else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))


def early_signal() -> signal.Signals | None:
    """The signal `catch_signals_now` kept, if one came."""
    return None if _EARLY["signal"] is None else signal.Signals(_EARLY["signal"])


def keep_signal(signum: signal.Signals) -> None:
    """Keep `signum` as `catch_signals_now` would have (it came while
    `pod.initialize` waited)."""
    _EARLY["signal"], _EARLY["at"] = signum, time.time()


def _name(signum) -> str:
    return "SIGINT" if signum == signal.SIGINT else "SIGTERM"


def longest(seconds: float) -> float:
    """The most of every process's `seconds` (a stop's time is the slowest
    process's); every process must call it at the same point."""
    if jax.process_count() == 1:
        return seconds
    return max(map(float, exchange(f"longest/{next(_EXCHANGES)}", repr(seconds))))


def signalled_during_start_up(requests: dict) -> str | None:
    """Just before step 1 every process says whether a signal has reached it
    since training was called: why every process stops there (a process's
    signal, named "process P: SIGTERM" on the others), else None."""
    mine = _name(requests["signal"]) if requests["signal"] else ""
    every = [mine] if jax.process_count() == 1 else exchange(
        f"signalled/{next(_EXCHANGES)}", mine)
    for p, why in enumerate(every):
        if why:
            requests.setdefault("at", time.time())
            return why if p == jax.process_index() else f"process {p}: {why}"
    return None


def stopped_during_start_up(step: int, why: str, requests: dict, log) -> dict:
    """Record a stop agreed before step 1 (no new step: no checkpoint)."""
    seconds = longest(time.time() - requests["at"])
    say(f"stopped before step {step + 1} ({why}), {seconds:.1f} s after the signal: no step "
        "was trained, so there was nothing new to save. Run the same command again to "
        "resume.")
    record = {"step": step, "event": "stopped", "signal": why, "stop_seconds": round(seconds, 2),
              "before_step_1": True}
    log.write(record)
    return record


@contextlib.contextmanager
def stop_requests():
    """{"signal": None} until SIGINT or SIGTERM arrives (a second one acts as
    usual), or the one that came before (`catch_signals_now`)."""
    stop, handlers = {"signal": None}, {}
    if _EARLY["signal"] is not None:
        stop.update(signal=_EARLY["signal"], at=_EARLY["at"])
        _EARLY["signal"] = None

    def request_stop(signum, frame):
        stop["signal"], stop["at"] = signum, time.time()
        signal.signal(signum, handlers[signum])

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            before = signal.signal(sig, request_stop)
            handlers[sig] = _EARLY["handlers"].get(sig, before)
        except ValueError:  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)


class StopPolicy:
    """Polled at the end of every step: `why` the run stops there (None: it
    goes on), `signalled` when a signal (here or in another process) is the
    reason, and whether a timed save is due."""

    def __init__(self, config: TrainConfig, requests: dict):
        self.max_seconds, self.save_every = config.max_seconds, config.checkpoint_every_seconds
        self.requests = requests  # from stop_requests()
        self.decisions = Decisions(config.decide_every)
        self.t_start = self.last_save = time.time()
        self.why: str | None = None
        self.signalled = False

    def poll(self, step: int) -> bool:
        """At the end of `step`: whether every process saves a checkpoint now
        by wall time (sets `why` and `signalled`)."""
        sig = self.requests["signal"]
        timed_out = self.max_seconds is not None and time.time() - self.t_start > self.max_seconds
        why = _name(sig) if sig else "time limit" if timed_out else None
        save_due = self.save_every is not None and time.time() - self.last_save > self.save_every
        self.why, timed_save = self.decisions.poll(step, why, save_due)
        self.signalled = self.why is not None and not self.why.endswith("time limit")
        if self.signalled:  # another process's notice reaches this one now
            self.requests.setdefault("at", time.time())
        return timed_save

    def saved(self) -> None:
        self.last_save = time.time()

    def report(self, step: int, log) -> None:
        """Say why the run stopped at `step` (its checkpoint saved), and record
        a signal's stop in the metrics log, with the slowest process's time
        from the signal to the saved checkpoint."""
        seconds = longest(time.time() - self.requests["at"]) if self.signalled else None
        took = (f" {seconds:.1f} s after the signal, without evaluating"
                if self.signalled else "")
        say(f"stopped at step {step} ({self.why}){took}; checkpoint saved. Run the same command "
            "again to resume.")
        if self.signalled:
            log.write({"step": step, "event": "stopped", "signal": self.why,
                       "stop_seconds": round(seconds, 2)})
