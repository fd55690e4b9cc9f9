"""The training loop: `train_and_evaluate(config, workdir)`.

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
import json
import logging
import math
import time
from typing import Any, Callable

import jax

from elmo_jax import errors
from elmo_jax.formats import checkpoints
from elmo_jax.storage import paths
from elmo_jax import data as data_lib
from elmo_jax.config import Config, ConfigError, check_paths, check_ranges, save_config
from elmo_jax.core.options import ElmoOptions
from elmo_jax.formats.stored_model import CONFIG_FILE, StoredModel, read_run
from elmo_jax.training.evaluation import check_eval_batch, evaluate, warm_evaluation
from elmo_jax.training.feeding import Feeder
from elmo_jax.training.partitioning import (abstract_batch, check_divisible, create_train_step,
                                            process_rows, train_mesh)
from elmo_jax.training.pod import (agree_on_the_run, agree_on_the_workdir,
                                   failures_stop_every_process)
from elmo_jax.training.reporting import (CompileCount, MetricsWindow, ProfileWindow, Progress,
                                         say)
from elmo_jax.training.stopping import (StopPolicy, signalled_during_start_up, stop_requests,
                                        stopped_during_start_up)
from elmo_jax.training.workdir import (MetricsLog, TrainingError, flat_settings, load_pretrained,
                                       run_lexicon, restore_checkpoint, save_checkpoint,
                                       settings_on_resume, write_run)
from elmo_jax.core.vocab import Vocabulary

logger = logging.getLogger(__name__)


def _resolve_model(config: Config, workdir: str, vocab: Vocabulary, resuming: bool
                   ) -> tuple[Config, dict, StoredModel | None]:
    """(the config a run trains with, the settings changed on resume, the
    pretrained model): resuming, the workdir's model with the settings a
    checkpoint leaves free taken from `config` (`workdir.settings_on_resume`);
    with `data.init_from`, the pretrained model's architecture; else the
    config's; sized to the vocabulary."""
    pretrained = None
    model = config.model
    if model.n_tokens_vocab is not None and model.n_tokens_vocab != len(vocab):
        raise ConfigError(f"the options say n_tokens_vocab {model.n_tokens_vocab} but the "
                          f"vocabulary {config.data.vocab_file} has {len(vocab)} entries: remove "
                          "n_tokens_vocab (it is set from the vocabulary) or use the matching "
                          "vocabulary")
    if resuming:
        saved, saved_vocab = read_run(workdir)
        if saved_vocab.words != vocab.words:
            raise ConfigError(f"{workdir} was trained with another vocabulary than "
                              f"{config.data.vocab_file} ({len(saved_vocab)} words, the run's "
                              f"own in {workdir}/vocab.txt; this one has {len(vocab)}): resume "
                              f"with it, or start a new run from this one: --init_from "
                              f"{workdir} --workdir NEW_DIR")
        if saved.data.init_from:  # a fine-tuning run has its pretrained model's architecture
            config = config.replace(data=dataclasses.replace(
                config.data, init_from=config.data.init_from or saved.data.init_from))
            model = model.replace(lstm=saved.model.lstm, char_cnn=saved.model.char_cnn)
        return settings_on_resume(config.replace(model=model.replace(n_tokens_vocab=len(vocab))),
                                  saved, workdir) + (None,)
    elif config.data.init_from:
        pretrained = load_pretrained(config.data.init_from, vocab)
        if not pretrained.options.same_model(model):
            logger.info(f"--init_from: using the pretrained model's architecture from "
                        f"{config.data.init_from}")
        model = model.replace(lstm=pretrained.options.lstm, char_cnn=pretrained.options.char_cnn)
    return config.replace(model=model.replace(n_tokens_vocab=len(vocab))), {}, pretrained


def segmented(config: Config) -> Config:
    """With `data.tokenize`, the run reads its train and held-out files as
    tokenised once into the cache (`segmentation.segmented_files`)."""
    d = config.data
    if not d.tokenize:
        return config
    from elmo_jax.data.segmentation import segmented_files

    if d.source != "text" or (d.train_files and data_lib.tokens.is_prepared(d.train_files)):
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
            paths.open(path, "rb").close()
        except OSError as e:
            raise data_lib.DataError(f"{what} {path} cannot be read: {e.strerror}") from None


def check_before_training(config: Config, vocab: Vocabulary, mesh, source=None) -> None:
    """Everything a run could otherwise die of after it has trained, checked
    before step 1 (a pod restarted on a bad setting would die at the same place
    every time and lose the steps since its last checkpoint): the batch, the
    evaluation batch and the softmax against the mesh, the model axis within a
    host, the files present and readable, and the step limit."""
    check_ranges(config.train)  # a Config built in Python has not been through the reader
    try:
        check_divisible(config.model, len(vocab), mesh)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tc = config.train
    if config.data.eval_files:
        _readable(config.data.eval_files, "held-out file")
        check_eval_batch(tc, mesh.size)
    if (source is None and config.data.source == "text" and config.data.train_files
            and not data_lib.tokens.is_prepared(config.data.train_files)):
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


def train_and_evaluate(config: Config, workdir: str, progress: bool = True, source=None) -> dict:
    """Train a biLM, or resume its run, in `workdir`.

    Args:
        config: the run's `Config` (`config.load_config`: model, train, data).
        workdir: the run's folder, local or `gs://` (see the workdir format).
        progress: show a progress bar.
        source: replaces the config's corpus (a `data.TokenCorpus` or a list
            of token lists: tests, custom corpora).

    Returns:
        The last metrics record (a dict with `step`, `train_loss`, and
        `eval_ppl` when evaluating).

    A SIGINT or SIGTERM stops the run at a step with a checkpoint (the handlers
    are the caller's again afterwards); in a run of several processes an error
    on any one ends every process.
    """
    # signals are caught from here on: one during start-up stops every process
    # just before step 1 (`stopping.signalled_during_start_up`)
    with failures_stop_every_process(), stop_requests() as requests:
        return _train_and_evaluate(config, workdir, progress, source, requests)


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


# a host's own business: its clock (the stop it proposes is agreed, process 0's
# alone proposes timed saves), its input workers, its guard and its trace
HOST_SETTINGS = {"train.max_seconds", "train.checkpoint_every_seconds", "train.input_workers",
                 "train.transfer_guard", "train.profile_steps"}
# hosts may mount the same files at other paths (their contents are compared)
PATH_SETTINGS = {"data.train_files", "data.eval_files", "data.vocab_file", "data.init_from"}


def run_facts(config: Config, vocab: Vocabulary, corpus: data_lib.TokenCorpus) -> dict:
    """What every process of a run must share (`pod.agree_on_the_run`): the
    corpus's and the vocabulary's fingerprints and every setting but the
    files' paths and a host's own (HOST_SETTINGS)."""
    mine = PATH_SETTINGS | HOST_SETTINGS | {"description"}
    return {"corpus": corpus.fingerprint(), "vocabulary": vocab.fingerprint(),
            **{k: json.dumps(v) for k, v in flat_settings(config.to_dict()).items()
               if k not in mine}}


def _train_and_evaluate(config: Config, workdir: str, progress: bool, source,
                        requests: dict) -> dict:
    if not config.data.vocab_file:
        raise ConfigError("no vocabulary: give --vocab_file (data.vocab_file)")
    check_paths(config.data)
    workdir = paths.check(workdir)
    checkpoints.checkpoint_dir(workdir)  # refuses a workdir orbax cannot write to
    vocab = Vocabulary.from_file(config.data.vocab_file)
    config = segmented(config)
    paths.makedirs(workdir)
    mngr = checkpoints.manager(workdir, config.train.max_to_keep, config.train.async_checkpoints)
    resume_step = mngr.latest_step()
    agree_on_the_workdir(workdir, resume_step)
    config, changed, pretrained = _resolve_model(config, workdir, vocab, resume_step is not None)
    lexicon = run_lexicon(workdir, config.model, pretrained)
    mesh = train_mesh(config.model, config.train, len(vocab))
    check_before_training(config, vocab, mesh, source)
    corpus = open_training_corpus(config, source)
    agree_on_the_run(run_facts(config, vocab, corpus))
    batcher = make_batcher(config, vocab, mesh, corpus, lexicon)
    built = create_train_step(config.model, config.train, len(vocab), mesh)
    t0 = time.time()
    programs = compile_ahead(built.step, built.abstract_state, batcher.shapes, config.model, mesh)
    if config.data.eval_files:
        warm_evaluation(built.abstract_state.params, config.model, config.train, mesh)
    if jax.process_index() == 0 and programs:
        logger.info(f"compiled {programs} train program(s) for token tables of "
                    f"{' or '.join(map(str, batcher.shapes.rows))} rows and "
                    f"{' or '.join(map(str, batcher.shapes.widths))} characters in "
                    f"{time.time() - t0:.1f} s")

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
            logger.info(f"resuming from the checkpoint of step {resume_step}")
        if changed and jax.process_index() == 0:  # once the checkpoint has been read
            logger.info("resuming with changed settings: " + ", ".join(
                f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in changed.items()))
            save_config(config, paths.join(workdir, CONFIG_FILE))
    else:
        state, count = rewind(None)
        write_run(workdir, config, vocab, lexicon)
    run = _Run(config, vocab, workdir, mesh, built.step, batcher, rewind, mngr, lexicon)
    log = MetricsLog(workdir, purge_step=None if resume_step is None else resume_step + 1)
    storage_failed = False
    try:
        if resume_step is not None:
            log.write({"step": resume_step, "event": "resumed", "from_step": resume_step,
                       "processes": jax.process_count(), "devices": jax.device_count(),
                       **({"changed": changed} if changed else {})})
        why = signalled_during_start_up(requests)
        if why is not None:
            return stopped_during_start_up(int(state.step), why, requests, log)
        return _loop(run, state, count, StopPolicy(config.train, requests), resume_step,
                     progress, log)
    except (errors.StorageError, checkpoints.CheckpointError):
        storage_failed = True
        raise
    finally:
        log.close(upload=not storage_failed)
        mngr.wait_until_finished()
        if hasattr(batcher, "close"):
            batcher.close()


@dataclasses.dataclass(frozen=True)
class _Run:
    """The parts of a run that the loop uses and does not change."""
    config: Config
    vocab: Vocabulary
    workdir: str
    mesh: Any
    step_fn: Callable  # (state, batch) -> (state, metrics)
    batcher: Any
    rewind: Callable  # checkpoint step or None -> (state, batches read before it)
    mngr: Any
    lexicon: Any

    def evaluate(self, state) -> dict:
        return evaluate(state.params, self.config.model, self.config.train, self.vocab,
                        self.config.data.eval_files, self.mesh, self.lexicon)


class NonfiniteGuard:
    """The batches passed over after a non-finite loss: each one sends the run
    back to its last checkpoint, `train.nonfinite_skips` times a run; one more
    stops it with the last good checkpoint kept."""

    def __init__(self, limit: int, log: MetricsLog):
        self.limit, self.log = limit, log
        self.skipped, self.skip = 0, set()  # the batch numbers the feeder passes over

    def pass_over(self, bad: tuple[int, int, float], last_saved: int | None) -> None:
        """Record `bad` = (step, batch number, loss) and pass over its batch,
        or raise TrainingError past the limit."""
        step, number, loss = bad
        self.skipped += 1
        self.log.write({"step": step, "event": "nonfinite_loss", "train_loss": loss,
                        "back_to_step": last_saved or 0, "skipped_batches": self.skipped})
        if self.skipped > self.limit:
            kept = (f"the last good checkpoint (step {last_saved}) is kept"
                    if last_saved is not None else "no checkpoint had been written")
            raise TrainingError(
                f"the loss became {loss} at step {step}, the {self.skipped}th non-finite loss of "
                f"this run (train.nonfinite_skips {self.limit}): training stopped and {kept}. "
                "Lower the learning rate or check the data.")
        say(f"the loss became {loss} at step {step}: going back to step {last_saved or 0} and "
            f"past that batch ({self.skipped} of {self.limit} skips)")
        self.skip.add(number)


def _loop(run: _Run, state, count: int, stops: StopPolicy, last_saved: int | None,
          progress: bool, log: MetricsLog) -> dict:
    """Steps until the limit or an agreed stop; returns the last record."""
    tc, eval_files = run.config.train, run.config.data.eval_files
    max_steps = _max_steps(run.config)
    step = first = int(state.step)
    last = {"step": step}
    window, compiles = MetricsWindow(time.time()), CompileCount()
    guard, profile = NonfiniteGuard(tc.nonfinite_skips, log), ProfileWindow(tc.profile_steps,
                                                                             run.workdir)
    in_flight: collections.deque = collections.deque(maxlen=3)  # the newest steps' losses
    bar = Progress(step, max_steps, tc.max_seconds, progress)
    feeder = Feeder(run.batcher, run.mesh, count, guard.skip)
    try:
        while step < max_steps:
            profile.before(step + 1)
            with jax.transfer_guard_device_to_host(tc.transfer_guard):
                placed = feeder.next()
                with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                    state, metrics = run.step_fn(state, placed.arrays)
                step += 1
                compiles.step_dispatched()
                if step == first + 1:  # the bar's rate leaves out start-up and step 1's wait
                    jax.block_until_ready(metrics["loss"])  # for the other processes
                    bar.begin(step)
                window.add(step, placed.number, metrics, placed.tokens)
                # the host stays two steps ahead of the devices, no more: waiting
                # for a step to finish reads nothing back
                in_flight.append(metrics["loss"])
                if len(in_flight) == in_flight.maxlen:
                    jax.block_until_ready(in_flight[0])
                timed_save = stops.poll(step)
                bar.update(step)
            profile.after(step, state)
            stopping = stops.why is not None
            log_now = step % tc.log_every == 0 or step == max_steps or stopping
            save_now = step % tc.checkpoint_every == 0 or timed_save or stopping \
                or step == max_steps
            # a preemption notice leaves seconds: after a signal, only the checkpoint
            eval_now = bool(eval_files and tc.eval_every and step % tc.eval_every == 0
                            and not stops.signalled)
            if not (log_now or save_now or eval_now):
                continue
            bad = window.read()
            if bad is not None:  # back to the last checkpoint, past the bad batch
                guard.pass_over(bad, last_saved)
                feeder.close()
                state, count = run.rewind(last_saved)
                step = last_saved or 0
                window.reset(time.time())
                in_flight.clear()
                feeder = Feeder(run.batcher, run.mesh, count, guard.skip)
                continue
            if log_now and window.n:
                last = {**window.record(step), **compiles.since_step_1()}
                log.write(last)
                bar.set(loss=f"{last['train_loss']:.3f}", tok_s=f"{last['tokens_per_sec']:.0f}")
            if save_now:
                save_checkpoint(run.mngr, state, placed.position, run.mesh)
                last_saved = step
                stops.saved()
            if eval_now:
                last = {"step": step, **run.evaluate(state), **compiles.since_step_1()}
                log.write(last)
            if stopping:
                stops.report(step, log)
                break
        if eval_files and not stops.signalled and not (tc.eval_every and step % tc.eval_every == 0):
            last = {"step": step, **run.evaluate(state), **compiles.since_step_1()}
            log.write(last)
    finally:
        profile.close()
        feeder.close()
        bar.close()
        compiles.close()
    return last
