"""What a training run reports as it goes: the metrics window (the devices'
numbers read only on log, save and evaluation steps), the progress bar, the
profile window, and the count of programs compiled since step 1."""
from __future__ import annotations

import logging
import math
import sys
import time

import jax

from elmo_jax.storage import copies, paths
from elmo_jax.config import profile_window

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # XLA compiled a program


class CompileCount:
    """Programs compiled since step 1 was dispatched: a program compiled then
    stalls the devices (`compiled_since_step_1`, 0 in a healthy run). Counted
    through JAX's monitoring events by a listener that lives from here to
    `close` (the process keeps no listener of ours after the run)."""

    def __init__(self):
        self.compiled, self.before = 0, None
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.compiled += 1

    def step_dispatched(self) -> None:
        if self.before is None:
            self.before = self.compiled

    def since_step_1(self) -> dict:
        """{"compiled_since_step_1": n} once step 1 is dispatched, else {}."""
        if self.before is None:
            return {}
        return {"compiled_since_step_1": self.compiled - self.before}

    def close(self) -> None:
        jax.monitoring.unregister_event_duration_listener(self._event)


def say(message: str) -> None:
    """Report `message` through the `elmo_jax.training` logger (the commands
    print it on stderr, leaving the progress bar whole: `cli.run_cli`)."""
    logging.getLogger("elmo_jax.training").info(message)


class MetricsWindow:
    """Training metrics since the last log record; the devices' numbers are
    read only when the loop asks (`read`: on log, save and evaluation steps)."""

    def __init__(self, t_start: float):
        self.t_start = t_start
        self.unread: list = []  # (step, batch number, device metrics)
        self.reset(t_start)

    def reset(self, now: float) -> None:
        self.t, self.tokens, self.loss, self.n, self.last = now, 0, 0.0, 0, None

    def add(self, step: int, number: int, metrics: dict, tokens: int) -> None:
        self.unread.append((step, number, metrics))
        self.tokens += tokens

    def read(self) -> tuple[int, int, float] | None:
        """Fetch the unread steps' metrics (one transfer); the first
        non-finite loss's (step, batch number, loss), else None."""
        fetched = jax.device_get([m for _, _, m in self.unread])
        try:
            for (step, number, _), m in zip(self.unread, fetched):
                loss = float(m["loss"])
                if not math.isfinite(loss):
                    return step, number, loss
                self.loss, self.n, self.last = self.loss + loss, self.n + 1, m
            return None
        finally:
            self.unread = []

    def record(self, step: int) -> dict:
        """The log record of the steps read since the last one."""
        now = time.time()
        mean = self.loss / max(self.n, 1)
        m = self.last
        out = {"step": step, "train_loss": mean, "train_ppl": math.exp(min(mean, 50.0)),
               "loss_forward": float(m["loss_forward"]),
               "loss_backward": float(m["loss_backward"]),
               "grad_norm": float(m["grad_norm"]),
               "tokens_per_sec": self.tokens / max(now - self.t, 1e-9),
               "elapsed_sec": now - self.t_start}
        self.reset(now)
        return out


class Progress:
    """The progress bar: over steps, or over seconds when only the time limit
    ends the run (its total and ETA then come from the limit). It appears
    once step 1 is done (`begin`): its rate and ETA leave out start-up, and
    the wait of step 1 for the other processes."""

    def __init__(self, step: int, max_steps: float, max_seconds: float | None, enabled: bool):
        self.by_time = max_steps == math.inf and max_seconds is not None
        self.max_steps, self.max_seconds, self.enabled = max_steps, max_seconds, enabled
        self.t0, self.postfix, self.step, self.bar = time.time(), {}, step, None

    def begin(self, step: int) -> None:
        """Show the bar from `step` on (step 1 of this run done)."""
        from tqdm import tqdm

        common = dict(disable=not self.enabled or jax.process_index() != 0, dynamic_ncols=True,
                      mininterval=0.5 if sys.stderr.isatty() else 30.0)
        if self.by_time:
            self.bar = tqdm(total=self.max_seconds, unit="s", **common, bar_format=(
                "{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]"))
        else:
            self.bar = tqdm(total=None if self.max_steps == math.inf else self.max_steps,
                            initial=step - 1, unit="step", **common)

    def set(self, **postfix) -> None:
        """New numbers beside the bar."""
        self.postfix.update(postfix)
        if self.bar is not None:
            self.bar.set_postfix(refresh=False, **({"step": self.step} if self.by_time else {}),
                                 **self.postfix)

    def update(self, step: int, **postfix) -> None:
        self.postfix.update(postfix)
        self.step = step
        if self.bar is None:
            return
        if self.by_time:
            self.bar.set_postfix(refresh=False, step=step, **self.postfix)
            self.bar.update(min(time.time() - self.t0, self.bar.total) - self.bar.n)
        else:
            if postfix:
                self.bar.set_postfix(refresh=False, **self.postfix)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class ProfileWindow:
    """A profiler trace of steps `train.profile_steps` ("first:last") into the
    run's TensorBoard folder; each process's in a folder of its own
    (tensorboard/process-P) when there are several (their traces would
    otherwise share one file name on one host)."""

    def __init__(self, profile_steps: str | None, workdir: str):
        self.window = profile_window(profile_steps)
        self.folder = paths.join(workdir, "tensorboard")
        if jax.process_count() > 1:
            self.folder = paths.join(self.folder, f"process-{jax.process_index()}")
        self.tracing = False
        self.mirror = None  # a bucket's trace is written locally, uploaded once whole

    def before(self, step: int) -> None:
        """Called before `step` is dispatched."""
        if self.window and step == self.window[0] and not self.tracing:
            self.mirror = copies.Mirror(self.folder)
            jax.profiler.start_trace(self.mirror.local)
            self.tracing = True

    def after(self, step: int, state) -> None:
        """Called after `step` is dispatched: the trace ends once it has run."""
        if self.tracing and step >= self.window[1]:
            jax.block_until_ready(state)
            self.close()

    def close(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False
            self.mirror.close()
