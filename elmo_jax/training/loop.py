"""The training loop: `train_and_evaluate(config, workdir)`, and evaluation.

Resumes exactly from the newest checkpoint in the workdir when there is one
(written by any number of processes, with the same global batch). Stops after
`train.max_steps` steps or `train.max_seconds`, or on SIGTERM or Ctrl-C (after
saving a checkpoint). A non-finite loss sends the run back to its last
checkpoint and past the batch that caused it (`train.nonfinite_skips` times a
run; then it stops, keeping the last good checkpoint).

Built so that an accelerator never waits: the train programs of every batch
shape are compiled before step 1, the batches come placed on the devices
(`feeding.Feeder`), the host reads the devices only on log, save and
evaluation steps, and the loop issues no collective of its own (stops and
timed saves are agreed through the key-value store: `pod.Decisions`).
"""
from __future__ import annotations

import collections
import dataclasses
import contextlib
import functools
import math
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax import checkpoints
from elmo_jax import data as data_lib
from elmo_jax.config import Config, ConfigError, TrainConfig, profile_window
from elmo_jax.hub import use_compilation_cache
from elmo_jax.model import init_state
from elmo_jax.options import ElmoOptions
from elmo_jax.softmax import pad_softmax
from elmo_jax.stored import StoredModel, open_model, read_run
from elmo_jax.training.feeding import Feeder
from elmo_jax.training.partitioning import (abstract_batch, check_divisible, create_train_step,
                                            global_batch, lstm_state_sharding, make_mesh,
                                            process_rows, train_mesh)
from elmo_jax.training.pod import Decisions, agree_on_the_workdir, failures_stop_every_process
from elmo_jax.training.steps import eval_step
from elmo_jax.training.workdir import (MetricsLog, TrainingError, load_pretrained, run_lexicon,
                                       restore_checkpoint, save_checkpoint, write_run)
from elmo_jax.vocab import Vocabulary


_COMPILED = [0]  # programs XLA compiled in this process (JAX's monitoring events)


def _count_compile(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILED[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def _check_eval_batch(config: TrainConfig, n_devices: int) -> None:
    if config.eval_batch_size % n_devices:
        raise ConfigError(f"train.eval_batch_size {config.eval_batch_size} must divide over "
                          f"the {n_devices} devices")


def _eval_sums(params, state, sums, batch, *, options, config, mesh):
    """eval_step with the sums kept on the devices: (state, sums [3]: the two
    directions' summed losses and the predictions)."""
    state, nll, n = eval_step(params, state, batch, options=options, config=config, mesh=mesh)
    return state, sums + jnp.concatenate([nll, n[None]])


@functools.lru_cache(maxsize=8)
def _eval_jit(options: ElmoOptions, config: TrainConfig, mesh):
    """(the jitted evaluation step, its batches' table shape, the start state
    maker) for `config.eval_batch_size` streams over `mesh`. One shape, the
    largest a window can need (two rows a position, the full width), so that
    it compiles once; `warm_evaluation` compiles it before training."""
    B, U = config.eval_batch_size, config.eval_unroll_steps
    shape = (data_lib.largest_table(B // mesh.size, U), options.char_cnn.ids_per_token)
    init = jax.jit(functools.partial(init_state, options, B),
                   out_shardings=lstm_state_sharding(mesh))
    step = jax.jit(functools.partial(_eval_sums, options=options, config=config, mesh=mesh),
                   donate_argnums=(1, 2),
                   out_shardings=(lstm_state_sharding(mesh), NamedSharding(mesh, P())))
    return step, shape, init


def warm_evaluation(params, options: ElmoOptions, config: TrainConfig, mesh) -> None:
    """Compile the evaluation step for `params` (as training holds them) now."""
    step, shape, init = _eval_jit(options, config, mesh)
    init.lower().compile()
    sums = jax.ShapeDtypeStruct((3,), jnp.float32, sharding=NamedSharding(mesh, P()))
    step.lower(params, jax.eval_shape(init), sums,
               abstract_batch(mesh, config.eval_batch_size, config.eval_unroll_steps,
                              shape)).compile()


def evaluate(params: dict, options: ElmoOptions, config: TrainConfig, vocab: Vocabulary,
             eval_files: str, mesh=None, lexicon=None) -> dict:
    """Perplexity over held-out files, read once in order by `eval_batch_size`
    streams with the state carried (row r reads sentences r, r + B, r + 2B,
    ... of the files in order): forward, backward, and bilm-tf's number, exp
    of the mean of the two directions' mean losses.

    The sums stay on the devices and are read once at the end; every batch
    has one shape (one program, compiled ahead when training evaluates). Over
    a mesh of several processes each process makes the windows of its own
    rows only, and the sums are global: one perplexity, equal to a single
    process's."""
    if mesh is None and jax.process_count() > 1:  # a local mesh would score a share only
        raise ConfigError(f"evaluate() in a program of {jax.process_count()} processes needs "
                          "the global mesh (mesh=, every process calling it), or run it in "
                          "one process")
    mesh = mesh if mesh is not None else make_mesh(1, jax.local_devices()[:1])
    _check_eval_batch(config, mesh.size)
    step, shape, init = _eval_jit(options, config, mesh)
    B, U = config.eval_batch_size, config.eval_unroll_steps
    corpus, tables = _held_out(eval_files, vocab, options.char_cnn.max_characters_per_token,
                               lexicon)
    batcher = data_lib.StreamBatcher(
        corpus, vocab, B, U, options.char_cnn.max_characters_per_token, n_groups=mesh.size,
        rows=process_rows(mesh, B), tables=tables, once=True,
        shapes=data_lib.TableShapes((shape[0],), (shape[1],)))
    state = init()
    sums = jax.device_put(np.zeros(3, np.float32), NamedSharding(mesh, P()))
    for _ in range(data_lib.batches_once(corpus, B, U)):  # the same count in every process
        state, sums = step(params, state, sums, global_batch(next(batcher), mesh))
    sums = np.asarray(jax.device_get(sums), np.float64)
    total, count = sums[:2], sums[2]
    mean = total / count
    return {"eval_ppl_forward": float(np.exp(mean[0])), "eval_ppl_backward": float(np.exp(mean[1])),
            "eval_ppl": float(np.exp(mean.mean())), "eval_tokens": int(count)}


_HELD_OUT: dict = {}  # the last held-out corpus read, with its spelling tables


def _held_out(eval_files: str, vocab: Vocabulary, max_chars: int, lexicon=None):
    """(TokenCorpus, SpellingTables) of the held-out files, read once per run
    (evaluation every `eval_every` steps reads the same files)."""
    key = (eval_files, id(vocab), max_chars, id(lexicon))
    if key not in _HELD_OUT:
        try:
            corpus = data_lib.TokenCorpus.from_files(eval_files)
        except data_lib.DataError as e:
            if "the corpus is empty" in str(e):
                raise data_lib.DataError(f"no held-out sentences in {eval_files!r}") from None
            raise
        _HELD_OUT.clear()
        _HELD_OUT[key] = corpus, data_lib.SpellingTables(corpus.spellings, vocab, max_chars,
                                                         lexicon=lexicon)
    return _HELD_OUT[key]


def evaluate_workdir(workdir: str, eval_files: str) -> dict:
    """Held-out perplexity of the newest checkpoint in `workdir`."""
    run = open_model(workdir)
    params = {"bilm": run.params, "softmax": pad_softmax(run.softmax, len(run.vocab))}
    return {"step": run.step,
            **evaluate(params, run.options, run.config.train, run.vocab, eval_files,
                       lexicon=run.lexicon)}


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
        # a fine-tuning run has its pretrained model's architecture, not the config's
        if not saved.model.same_model(model) and not config.data.init_from:
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


def segmented(config: Config) -> Config:
    """With `data.tokenize`, the run reads its train and held-out files as
    tokenised once into the cache (`segmentation.segmented_files`)."""
    d = config.data
    if not d.tokenize:
        return config
    from elmo_jax.segmentation import segmented_files

    if d.source != "text" or (d.train_files and data_lib.streams.is_prepared(d.train_files)):
        raise ConfigError("data.tokenize applies to text files (--train_files GLOB), not to "
                          "a prepared folder or lm1b")
    return config.replace(data=dataclasses.replace(
        d, train_files=d.train_files and segmented_files(d.train_files, d.tokenize),
        eval_files=d.eval_files and segmented_files(d.eval_files, d.tokenize)))


def open_training_corpus(config: Config, source=None) -> data_lib.TokenCorpus:
    """The run's corpus: `source` (a TokenCorpus or sentences), TFDS's lm1b, or
    `data.train_files` (a prepared folder, memory-mapped, or text shards,
    prepared in memory by every process)."""
    if isinstance(source, data_lib.TokenCorpus):
        return source
    if source is not None:
        return data_lib.TokenCorpus.from_sentences(source)
    if config.data.source == "lm1b":
        return data_lib.TokenCorpus.from_sentences(data_lib.lm1b_sentences("train"))
    if not config.data.train_files:
        raise ConfigError("no training data: give --train_files (data.train_files) or "
                          "--source lm1b")
    return data_lib.open_corpus(config.data.train_files)


def make_batcher(config: Config, vocab: Vocabulary, mesh, source=None, lexicon=None
                 ) -> data_lib.StreamBatcher:
    """This process's rows of the global batch, one token table per device
    (spelled with `lexicon` for a model that reads one)."""
    options = config.model
    batcher = data_lib.StreamBatcher(
        open_training_corpus(config, source), vocab, options.batch_size, options.unroll_steps,
        options.char_cnn.max_characters_per_token, n_groups=mesh.size,
        rows=process_rows(mesh, options.batch_size), seed=config.train.seed,
        widest_filter=options.char_cnn.widest_filter, lexicon=lexicon)
    if config.train.input_workers > 0:
        return data_lib.ParallelStreamBatcher(batcher, config.train.input_workers)
    return batcher


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
    if (source is None and config.data.source == "text" and config.data.train_files
            and not data_lib.streams.is_prepared(config.data.train_files)):
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


class _Window:
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
        self.t0, self.postfix, self.step = time.time(), {}, step

    def set(self, **postfix) -> None:
        """New numbers beside the bar."""
        self.postfix.update(postfix)
        self.bar.set_postfix(refresh=False, **({"step": self.step} if self.by_time else {}),
                             **self.postfix)

    def update(self, step: int, **postfix) -> None:
        self.postfix.update(postfix)
        self.step = step
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
    `source` replaces the config's corpus (a `data.TokenCorpus` or a list of
    token lists: tests, custom corpora). In a run of several processes an
    error on any one ends every process (`pod.failures_stop_every_process`)."""
    with failures_stop_every_process():
        return _train_and_evaluate(config, workdir, progress, source)


def compile_ahead(step, abstract_state, shapes, options: ElmoOptions, mesh) -> int:
    """Compile the train step for every table shape a run's batches take,
    before step 1 (a jitted step keeps them; a plain function is left alone).
    Returns the number of programs."""
    if not hasattr(step, "lower"):
        return 0
    for table in shapes.all():
        step.lower(abstract_state, abstract_batch(mesh, options.batch_size,
                                                  options.unroll_steps, table)).compile()
    return len(shapes.all())


def _train_and_evaluate(config: Config, workdir: str, progress: bool, source) -> dict:
    if not config.data.vocab_file:
        raise ConfigError("no vocabulary: give --vocab_file (data.vocab_file)")
    vocab = Vocabulary.from_file(config.data.vocab_file)
    config = segmented(config)
    os.makedirs(workdir, exist_ok=True)
    use_compilation_cache()
    mngr = checkpoints.manager(workdir, config.train.max_to_keep, config.train.async_checkpoints)
    resume_step = mngr.latest_step()
    agree_on_the_workdir(workdir, resume_step)
    config, pretrained = _resolve_model(config, workdir, vocab, resume_step is not None)
    lexicon = run_lexicon(workdir, config.model, pretrained)
    mesh = train_mesh(config.model, config.train, len(vocab))
    check_before_training(config, vocab, mesh, source)
    batcher = make_batcher(config, vocab, mesh, source, lexicon)
    built = create_train_step(config.model, config.train, len(vocab), mesh)
    t0 = time.time()
    programs = compile_ahead(built.step, built.abstract_state, batcher.shapes, config.model, mesh)
    if config.data.eval_files:
        warm_evaluation(built.abstract_state.params, config.model, config.train, mesh)
    if jax.process_index() == 0 and programs:
        print(f"compiled {programs} train program(s) for token tables of "
              f"{' or '.join(map(str, batcher.shapes.rows))} rows and "
              f"{' or '.join(map(str, batcher.shapes.widths))} characters in "
              f"{time.time() - t0:.1f} s", file=sys.stderr)

    def rewind(step: int | None):
        """(the state of checkpoint `step` (None: the run's start), the batches
        read before it), with the batcher set back to its data position."""
        if step is None:
            batcher.restore({"batches": 0, "cursors": None})
            return built.init(*((pretrained.params, pretrained.softmax) if pretrained
                                else (None, None))), 0
        mngr.wait_until_finished()
        state, position = restore_checkpoint(mngr, step, built.abstract_state, mesh,
                                             config.model.batch_size)
        batcher.restore(position)
        return state, position["batches"]

    if resume_step is not None:
        state, count = rewind(resume_step)
        if jax.process_index() == 0:
            print(f"resuming from the checkpoint of step {resume_step}", file=sys.stderr)
    else:
        state, count = rewind(None)
        write_run(workdir, config, vocab, lexicon)
    try:
        with _stop_requests() as stop:
            return _loop(config, vocab, workdir, state, count, built.step, batcher, mesh, rewind,
                         mngr, stop, resume_step, progress, lexicon)
    finally:
        mngr.wait_until_finished()
        if hasattr(batcher, "close"):
            batcher.close()


def _loop(config, vocab, workdir, state, count, step_fn, batcher, mesh, rewind, mngr, stop,
          last_saved, progress, lexicon=None) -> dict:
    from tqdm import tqdm

    tc, eval_files = config.train, config.data.eval_files
    max_steps = _max_steps(config)
    log = MetricsLog(workdir)
    step = int(state.step)
    last = {"step": step}
    t_start = last_save_time = time.time()
    window = _Window(t_start)
    decisions = Decisions(tc.decide_every)
    skipped, skip = 0, set()
    profile = profile_window(tc.profile_steps)
    profiling = signalled = False
    compiled_before = None  # programs compiled before step 1 was dispatched
    recent: collections.deque = collections.deque(maxlen=3)
    bar = _Progress(step, max_steps, tc.max_seconds, progress)
    feeder = Feeder(batcher, mesh, count, skip)
    try:
        while step < max_steps:
            if profile and step + 1 == profile[0] and not profiling:
                jax.profiler.start_trace(os.path.join(workdir, "tensorboard"))
                profiling = True
            with jax.transfer_guard_device_to_host(tc.transfer_guard):
                placed = feeder.next()
                with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                    state, metrics = step_fn(state, placed.arrays)
                step += 1
                if compiled_before is None:  # a program compiled later stalls the devices
                    compiled_before = _COMPILED[0]
                window.add(step, placed.number, metrics, placed.tokens)
                # the host stays two steps ahead of the devices, no more: waiting
                # for a step to finish reads nothing back
                recent.append(metrics["loss"])
                if len(recent) == recent.maxlen:
                    jax.block_until_ready(recent[0])
                timed_out = tc.max_seconds is not None and time.time() - t_start > tc.max_seconds
                why = ("SIGINT" if stop["signal"] == signal.SIGINT else "SIGTERM") \
                    if stop["signal"] else "time limit" if timed_out else None
                save_due = (tc.checkpoint_every_seconds is not None
                            and time.time() - last_save_time > tc.checkpoint_every_seconds)
                why, timed_save = decisions.poll(step, why, save_due)
                bar.update(step)
            if profiling and step >= profile[1]:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                profiling = False
            stopping = why is not None
            signalled = stopping and not why.endswith("time limit")
            if signalled:  # another process's notice reaches this one now
                stop.setdefault("at", time.time())
            log_now = step % tc.log_every == 0 or step == max_steps or stopping
            save_now = (step % tc.checkpoint_every == 0 or timed_save or stopping
                        or step == max_steps)
            eval_now = bool(eval_files and tc.eval_every and step % tc.eval_every == 0
                            and not signalled)
            if not (log_now or save_now or eval_now):
                continue
            bad = window.read()
            if bad is not None:
                bad_step, number, loss = bad
                skipped += 1
                kept = (f"the last good checkpoint (step {last_saved}) is kept"
                        if last_saved is not None else "no checkpoint had been written")
                log.write({"step": bad_step, "event": "nonfinite_loss", "train_loss": loss,
                           "back_to_step": last_saved or 0, "skipped_batches": skipped})
                if skipped > tc.nonfinite_skips:
                    raise TrainingError(
                        f"the loss became {loss} at step {bad_step}, the {skipped}th non-finite "
                        f"loss of this run (train.nonfinite_skips {tc.nonfinite_skips}): "
                        f"training stopped and {kept}. Lower the learning rate or check the "
                        "data.")
                tqdm.write(f"the loss became {loss} at step {bad_step}: going back to step "
                           f"{last_saved or 0} and past that batch ({skipped} of "
                           f"{tc.nonfinite_skips} skips)", file=sys.stderr)
                feeder.close()
                skip.add(number)
                state, count = rewind(last_saved)
                step = last_saved or 0
                window.reset(time.time())
                recent.clear()
                feeder = Feeder(batcher, mesh, count, skip)
                continue
            if log_now and window.n:
                last = {**window.record(step),
                        "compiled_since_step_1": _COMPILED[0] - compiled_before}
                log.write(last)
                bar.set(loss=f"{last['train_loss']:.3f}", tok_s=f"{last['tokens_per_sec']:.0f}")
            if save_now:
                save_checkpoint(mngr, state, placed.position, mesh)
                last_saved, last_save_time = step, time.time()
            # a preemption notice leaves seconds: after a signal, only the checkpoint
            if eval_now:
                last = {"step": step, **evaluate(state.params, config.model, tc, vocab,
                                                 eval_files, mesh, lexicon),
                        "compiled_since_step_1": _COMPILED[0] - compiled_before}
                log.write(last)
            if stopping:
                took = (f" {time.time() - stop['at']:.1f} s after the signal, without "
                        "evaluating" if signalled else "")
                tqdm.write(f"stopped at step {step} ({why}){took}; checkpoint saved. Run the "
                           "same command again to resume.", file=sys.stderr)
                if signalled:
                    log.write({"step": step, "event": "stopped", "signal": why,
                               "stop_seconds": round(time.time() - stop["at"], 2)})
                break
        if eval_files and not signalled and not (tc.eval_every and step % tc.eval_every == 0):
            last = {"step": step, **evaluate(state.params, config.model, tc, vocab, eval_files,
                                             mesh, lexicon)}
            if compiled_before is not None:
                last["compiled_since_step_1"] = _COMPILED[0] - compiled_before
            log.write(last)
    finally:
        if profiling:
            jax.profiler.stop_trace()
        feeder.close()
        bar.close()
        log.close()
    return last
