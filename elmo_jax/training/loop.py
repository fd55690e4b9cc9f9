"""The training loop: `train_and_evaluate(config, workdir)`, and evaluation.

Resumes exactly from the newest checkpoint in the workdir when there is one.
Stops after `train.max_steps` steps or `train.max_seconds`, or on SIGTERM or
Ctrl-C (after saving a checkpoint). A non-finite loss sends the run back to its
last checkpoint and past the batch that caused it (`train.nonfinite_skips`
times a run; then it stops, keeping the last good checkpoint).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from elmo_jax import checkpoints
from elmo_jax import data as data_lib
from elmo_jax.config import Config, ConfigError, TrainConfig
from elmo_jax.model import init_state
from elmo_jax.options import ElmoOptions
from elmo_jax.softmax import pad_softmax
from elmo_jax.stored import StoredModel, open_model, read_run
from elmo_jax.training.partitioning import (check_divisible, create_train_step,
                                            global_batch, lstm_state_sharding, make_mesh,
                                            process_part, train_mesh)
from elmo_jax.training.pod import agree_on_the_workdir, failures_stop_every_process
from elmo_jax.training.steps import eval_step
from elmo_jax.training.workdir import (MetricsLog, TrainingError, load_pretrained,
                                       restore_checkpoint, save_checkpoint, write_run)
from elmo_jax.vocab import Vocabulary

_eval_step_jit = jax.jit(eval_step, static_argnames=("options", "config", "mesh"))


def _check_eval_batch(config: TrainConfig, n_devices: int) -> None:
    if config.eval_batch_size % n_devices:
        raise ConfigError(f"train.eval_batch_size {config.eval_batch_size} must divide over "
                          f"the {n_devices} devices")


def evaluate(params: dict, options: ElmoOptions, config: TrainConfig, vocab: Vocabulary,
             eval_files: str, mesh=None) -> dict:
    """Perplexity over held-out files, read once in order by `eval_batch_size`
    streams with the state carried: forward, backward, and bilm-tf's number,
    exp of the mean of the two directions' mean losses.

    Over a mesh of several processes each process scores its share of the
    streams (the text is read everywhere, so the streams are the ones a single
    process reads) and the sums are global: one perplexity, equal to a single
    process's."""
    if mesh is None and jax.process_count() > 1:  # a local mesh would score a share only
        raise ConfigError(f"evaluate() in a program of {jax.process_count()} processes needs "
                          "the global mesh (mesh=, every process calling it), or run it in "
                          "one process")
    mesh = mesh if mesh is not None else make_mesh(1, jax.local_devices()[:1])
    n_rows = mesh.size
    _check_eval_batch(config, n_rows)
    batcher = data_lib.Batcher(data_lib.OnceSource(eval_files), vocab, config.eval_batch_size,
                               config.eval_unroll_steps,
                               options.char_cnn.max_characters_per_token, n_groups=n_rows,
                               widest_filter=options.char_cnn.widest_filter)
    step = functools.partial(_eval_step_jit, options=options, config=config, mesh=mesh)
    state = jax.jit(functools.partial(init_state, options, config.eval_batch_size),
                    out_shardings=lstm_state_sharding(mesh))()
    total, count = np.zeros(2), 0.0
    for batch in batcher:
        state, nll, n = step(params, state, global_batch(process_part(batch, mesh), mesh))
        total += np.asarray(nll.addressable_data(0), np.float64)
        count += float(n.addressable_data(0))
    if count == 0:
        raise data_lib.DataError(f"no held-out sentences in {eval_files!r}")
    mean = total / count
    return {"eval_ppl_forward": float(np.exp(mean[0])), "eval_ppl_backward": float(np.exp(mean[1])),
            "eval_ppl": float(np.exp(mean.mean())), "eval_tokens": int(count)}


def evaluate_workdir(workdir: str, eval_files: str) -> dict:
    """Held-out perplexity of the newest checkpoint in `workdir`."""
    run = open_model(workdir)
    params = {"bilm": run.params, "softmax": pad_softmax(run.softmax, len(run.vocab))}
    return {"step": run.step,
            **evaluate(params, run.options, run.config.train, run.vocab, eval_files)}


def _resolve_model(config: Config, workdir: str, vocab: Vocabulary, resuming: bool
                   ) -> tuple[Config, StoredModel | None]:
    """The model a run trains: the workdir's when resuming, the pretrained one's
    with `data.init_from`, else the config's; sized to the vocabulary."""
    pretrained = None
    model = config.model
    if model.n_tokens_vocab is not None and model.n_tokens_vocab != len(vocab):
        raise ConfigError(f"the options say n_tokens_vocab {model.n_tokens_vocab} but the "
                          f"vocabulary {config.data.vocab_file} has {len(vocab)} entries: remove "
                          "n_tokens_vocab (it is set from the vocabulary) or use the matching "
                          "vocabulary")
    if resuming:
        saved, saved_vocab = read_run(workdir)
        if not saved.model.same_model(model):
            raise TrainingError(f"{workdir} holds a run of another model; use a new --workdir")
        if saved_vocab.words != vocab.words:
            raise TrainingError(f"{workdir} was trained with another vocabulary than "
                                f"{config.data.vocab_file}")
        model = saved.model
    elif config.data.init_from:
        pretrained = load_pretrained(config.data.init_from, vocab)
        if not pretrained.options.same_model(model):
            print(f"--init_from: using the pretrained model's architecture from "
                  f"{config.data.init_from}", file=sys.stderr)
        model = model.replace(lstm=pretrained.options.lstm, char_cnn=pretrained.options.char_cnn)
    return config.replace(model=model.replace(n_tokens_vocab=len(vocab))), pretrained


def make_batcher(config: Config, vocab: Vocabulary, mesh, source=None):
    """This process's rows of the global batch, one token table per local device."""
    options = config.model
    rows, groups = options.batch_size // jax.process_count(), mesh.size // jax.process_count()
    shape = (options.unroll_steps, options.char_cnn.max_characters_per_token)
    widest = options.char_cnn.widest_filter  # batches spell tokens only as far as the CNN needs
    where = dict(seed=config.train.seed, process_index=jax.process_index(),
                 process_count=jax.process_count())
    if source is None and config.data.source == "lm1b":
        source = data_lib.lm1b_source("train", **where)
    elif source is None:
        if not config.data.train_files:
            raise ConfigError("no training data: give --train_files (data.train_files) or "
                              "--source lm1b")
        if config.train.input_workers > 0:
            return data_lib.ParallelBatcher(config.data.train_files, vocab, rows, *shape,
                                            n_groups=groups, workers=config.train.input_workers,
                                            widest_filter=widest, **where)
        source = data_lib.TextSource(config.data.train_files, **where)
    return data_lib.Batcher(source, vocab, rows, *shape, n_groups=groups, widest_filter=widest)


def _readable(pattern: str, what: str) -> None:
    for path in data_lib.list_shards(pattern):
        try:
            open(path, "rb").close()
        except OSError as e:
            raise data_lib.DataError(f"{what} {path} cannot be read: {e.strerror}") from None


def check_before_training(config: Config, vocab: Vocabulary, mesh, source=None) -> None:
    """Everything a run could otherwise die of after it has trained, checked
    before step 1 (a pod restarted on a bad setting would die at the same place
    every time and lose the steps since its last checkpoint): the batch, the
    evaluation batch and the softmax against the mesh, the model axis within a
    host, the files present and readable, and the step limit."""
    try:
        check_divisible(config.model, len(vocab), mesh)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tc = config.train
    if config.data.eval_files:
        _readable(config.data.eval_files, "held-out file")
        _check_eval_batch(tc, mesh.size)
    if source is None and config.data.source == "text" and config.data.train_files:
        _readable(config.data.train_files, "training file")
    if jax.process_count() > 1 and mesh.shape["model"] > jax.local_device_count():
        raise ConfigError(f"train.mesh_model {mesh.shape['model']} is more than the "
                          f"{jax.local_device_count()} devices of one host: the softmax shards' "
                          "exchanges would cross hosts every step; use a smaller mesh_model")
    _max_steps(config)


def _max_steps(config: Config) -> float:
    """train.max_steps, else bilm-tf's n_epochs over n_train_tokens, else no
    limit but train.max_seconds (which always applies when set)."""
    options, train = config.model, config.train
    if train.max_steps is not None:
        return train.max_steps
    if options.n_train_tokens:
        return options.n_epochs * (options.n_train_tokens
                                   // (options.batch_size * options.unroll_steps))
    if train.max_seconds is not None:
        return math.inf
    raise ConfigError("give train.max_steps, train.max_seconds, or n_train_tokens and "
                      "n_epochs in the model options")


@contextlib.contextmanager
def _stop_requests():
    """{"signal": None} until SIGINT or SIGTERM arrives (a second one acts as usual)."""
    stop, handlers = {"signal": None}, {}

    def request_stop(signum, frame):
        stop["signal"], stop["at"] = signum, time.time()
        signal.signal(signum, handlers[signum])

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            handlers[sig] = signal.signal(sig, request_stop)
        except ValueError:  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)


def _agree(*flags: bool) -> tuple[bool, ...]:
    """Each flag as any process has it: a signal or a time limit reaches one
    host, but all must stop at the same step, after one collective checkpoint."""
    if jax.process_count() == 1:
        return flags
    every = multihost_utils.process_allgather(np.array(flags, np.int32))
    return tuple(bool(x) for x in np.max(every.reshape(-1, len(flags)), axis=0))


class _Window:
    """Training metrics averaged over the steps since the last log record."""

    def __init__(self, t_start: float):
        self.t_start = t_start
        self.reset(t_start)

    def reset(self, now: float) -> None:
        self.t, self.tokens, self.loss, self.n = now, 0, 0.0, 0

    def add(self, loss: float, tokens: int) -> None:
        self.loss, self.tokens, self.n = self.loss + loss, self.tokens + tokens, self.n + 1

    def record(self, step: int, metrics: dict) -> dict:
        now = time.time()
        mean = self.loss / self.n
        out = {"step": step, "train_loss": mean, "train_ppl": math.exp(min(mean, 50.0)),
               "loss_forward": float(metrics["loss_forward"]),
               "loss_backward": float(metrics["loss_backward"]),
               "grad_norm": float(metrics["grad_norm"]),
               "tokens_per_sec": self.tokens / max(now - self.t, 1e-9),
               "elapsed_sec": now - self.t_start}
        self.reset(now)
        return out


class _Progress:
    """The progress bar: over steps, or over seconds when only the time limit
    ends the run (its total and ETA then come from the limit)."""

    def __init__(self, step: int, max_steps: float, max_seconds: float | None, enabled: bool):
        from tqdm import tqdm

        self.by_time = max_steps == math.inf and max_seconds is not None
        common = dict(disable=not enabled or jax.process_index() != 0, dynamic_ncols=True,
                      mininterval=0.5 if sys.stderr.isatty() else 30.0)
        if self.by_time:
            self.bar = tqdm(total=max_seconds, unit="s", **common, bar_format=(
                "{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]"))
        else:
            self.bar = tqdm(total=None if max_steps == math.inf else max_steps, initial=step,
                            unit="step", **common)
        self.t0, self.postfix = time.time(), {}

    def update(self, step: int, **postfix) -> None:
        self.postfix.update(postfix)
        if self.by_time:
            self.bar.set_postfix(refresh=False, step=step, **self.postfix)
            self.bar.update(min(time.time() - self.t0, self.bar.total) - self.bar.n)
        else:
            if postfix:
                self.bar.set_postfix(refresh=False, **self.postfix)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def train_and_evaluate(config: Config, workdir: str, progress: bool = True, source=None) -> dict:
    """Train (or resume) in `workdir`; returns the last metrics record.
    `source` replaces the config's sentence source (tests, custom corpora).
    In a run of several processes an error on any one ends every process
    (`pod.failures_stop_every_process`)."""
    with failures_stop_every_process():
        return _train_and_evaluate(config, workdir, progress, source)


def _train_and_evaluate(config: Config, workdir: str, progress: bool, source) -> dict:
    if not config.data.vocab_file:
        raise ConfigError("no vocabulary: give --vocab_file (data.vocab_file)")
    vocab = Vocabulary.from_file(config.data.vocab_file)
    os.makedirs(workdir, exist_ok=True)
    mngr = checkpoints.manager(workdir, config.train.max_to_keep, config.train.async_checkpoints)
    resume_step = mngr.latest_step()
    agree_on_the_workdir(workdir, resume_step)
    config, pretrained = _resolve_model(config, workdir, vocab, resume_step is not None)
    mesh = train_mesh(config.model, config.train, len(vocab))
    check_before_training(config, vocab, mesh, source)
    batcher = make_batcher(config, vocab, mesh, source)
    built = create_train_step(config.model, config.train, len(vocab), mesh)
    start = batcher.position()

    def rewind(step: int | None):
        """The state of checkpoint `step` (None: the run's start), with the
        batcher set back to its data position."""
        if hasattr(batcher, "close"):
            batcher.close()  # input workers restart from the position
        if step is None:
            batcher.restore(start)
            return built.init(*((pretrained.params, pretrained.softmax) if pretrained
                                else (None, None)))
        mngr.wait_until_finished()
        state, position = restore_checkpoint(mngr, step, built.abstract_state)
        batcher.restore(position)
        return state

    if resume_step is not None:
        state = rewind(resume_step)
        if jax.process_index() == 0:
            print(f"resuming from the checkpoint of step {resume_step}", file=sys.stderr)
    else:
        state = rewind(None)
        write_run(workdir, config, vocab)
    try:
        with _stop_requests() as stop:
            return _loop(config, vocab, workdir, state, built.step, Feed(batcher, mesh), rewind,
                         mngr, stop, resume_step, progress)
    finally:
        mngr.wait_until_finished()
        if hasattr(batcher, "close"):
            batcher.close()


class Feed:
    """The run's global batches, counted from where this process started
    reading; a batch that made the loss non-finite is passed over once the run
    has gone back to a checkpoint before it."""

    def __init__(self, batcher, mesh):
        self.batcher, self.mesh = batcher, mesh
        self.count, self.skip = 0, set()  # batches read; the numbers of those passed over

    def next(self) -> tuple[dict, dict, int]:
        """(global batch, data position after it, its number)."""
        while self.count + 1 in self.skip:
            next(self.batcher)
            self.count += 1
        host = next(self.batcher)
        self.count += 1
        return global_batch(host, self.mesh), self.batcher.position(), self.count


def _loop(config, vocab, workdir, state, step_fn, feed, rewind, mngr, stop, last_saved,
          progress) -> dict:
    from tqdm import tqdm

    tc, eval_files = config.train, config.data.eval_files
    max_steps = _max_steps(config)
    log = MetricsLog(workdir)
    step = int(state.step)
    last = {"step": step}
    t_start = time.time()
    window = _Window(t_start)
    signalled = False
    skipped = 0
    saved_count = 0  # batches read before the last checkpoint (or the start)
    bar = _Progress(step, max_steps, tc.max_seconds, progress)
    try:
        batch, position, number = feed.next()
        while step < max_steps:
            state, metrics = step_fn(state, batch)
            # the data position after the batch just used, and that batch's number
            state_position, used = position, number
            if step + 1 < max_steps:  # made on the host while the device computes
                batch, position, number = feed.next()
            loss = float(metrics["loss"])
            step += 1
            if not math.isfinite(loss):
                skipped += 1
                kept = (f"the last good checkpoint (step {last_saved}) is kept"
                        if last_saved is not None else "no checkpoint had been written")
                log.write({"step": step, "event": "nonfinite_loss", "train_loss": loss,
                           "back_to_step": last_saved or 0, "skipped_batches": skipped})
                if skipped > tc.nonfinite_skips:
                    raise TrainingError(
                        f"the loss became {loss} at step {step}, the {skipped}th non-finite "
                        f"loss of this run (train.nonfinite_skips {tc.nonfinite_skips}): "
                        f"training stopped and {kept}. Lower the learning rate or check the "
                        "data.")
                tqdm.write(f"the loss became {loss} at step {step}: going back to step "
                           f"{last_saved or 0} and past that batch ({skipped} of "
                           f"{tc.nonfinite_skips} skips)", file=sys.stderr)
                state = rewind(last_saved)
                feed.count, step = saved_count, last_saved or 0
                feed.skip.add(used)
                batch, position, number = feed.next()
                continue
            window.add(loss, int(metrics["tokens"]))
            timed_out = tc.max_seconds is not None and time.time() - t_start > tc.max_seconds
            # every process stops at the same step: the reasons are agreed first
            signalled, timed_out = _agree(bool(stop["signal"]), timed_out)
            if signalled:  # another process's notice reaches this one now
                stop.setdefault("at", time.time())
            stopping = signalled or timed_out
            if step % tc.log_every == 0 or step == max_steps or stopping:
                last = window.record(step, metrics)
                log.write(last)
                bar.update(step, loss=f"{last['train_loss']:.3f}",
                           tok_s=f"{last['tokens_per_sec']:.0f}")
            else:
                bar.update(step)
            if step % tc.checkpoint_every == 0 or stopping:
                save_checkpoint(mngr, state, state_position)
                last_saved, saved_count = step, used
            # a preemption notice leaves seconds: after a signal, only the checkpoint
            if eval_files and tc.eval_every and step % tc.eval_every == 0 and not signalled:
                last = {"step": step, **evaluate(state.params, config.model, tc, vocab, eval_files,
                                                 feed.mesh)}
                log.write(last)
            if stopping:
                why = ("time limit" if timed_out else signal.Signals(stop["signal"]).name
                       if stop["signal"] else "another process was signalled")
                took = (f" {time.time() - stop['at']:.1f} s after the signal, without "
                        "evaluating" if signalled else "")
                tqdm.write(f"stopped at step {step} ({why}){took}; checkpoint saved. Run the "
                           "same command again to resume.", file=sys.stderr)
                if signalled:
                    log.write({"step": step, "event": "stopped", "signal": why,
                               "stop_seconds": round(time.time() - stop["at"], 2)})
                break
        if step == max_steps and last_saved != step:
            save_checkpoint(mngr, state, state_position)
        if eval_files and not signalled and not (tc.eval_every and step % tc.eval_every == 0):
            last = {"step": step, **evaluate(state.params, config.model, tc, vocab, eval_files,
                                             feed.mesh)}
            log.write(last)
    finally:
        bar.close()
        log.close()
    return last
