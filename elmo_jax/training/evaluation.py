"""Held-out perplexity: `evaluate(params, ...)` over files read once in
order, with the state carried, and `evaluate_workdir` for a run's newest
checkpoint. The step is compiled once, for one batch shape (training compiles
it before step 1: `warm_evaluation`). `unigram_perplexity` is the floor a
biLM must beat."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax import data as data_lib
from elmo_jax.config import ConfigError, TrainConfig
from elmo_jax.core.bilm import init_state
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.softmax import pad_softmax
from elmo_jax.formats.stored_model import open_model
from elmo_jax.training.partitioning import (abstract_batch, global_batch, lstm_state_sharding,
                                            make_mesh, process_rows)
from elmo_jax.training.steps import eval_step
from elmo_jax.core.vocab import Vocabulary


def check_eval_batch(config: TrainConfig, n_devices: int) -> None:
    """The evaluation batch's streams divide over the devices."""
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
    check_eval_batch(config, mesh.size)
    step, shape, init = _eval_jit(options, config, mesh)
    B, U = config.eval_batch_size, config.eval_unroll_steps
    corpus, tables = _held_out(eval_files, vocab, options.char_cnn.max_characters_per_token,
                               lexicon)
    batcher = data_lib.StreamBatcher(
        corpus, vocab, B, U, options.char_cnn.max_characters_per_token, n_groups=mesh.size,
        rows=process_rows(mesh, B), tables=tables, once=True,
        shapes=data_lib.TableShapes((shape[0],), (shape[1],)))
    state = init()
    # from a callback: device_put over several processes first checks that the
    # value is the same on each (a gather, compiled mid-run)
    sums = jax.make_array_from_callback((3,), NamedSharding(mesh, P()),
                                        lambda index: np.zeros(3, np.float32)[index])
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
        corpus = data_lib.TokenCorpus.from_files(eval_files, what="held-out")
        _HELD_OUT.clear()
        _HELD_OUT[key] = corpus, data_lib.SpellingTables.spell(corpus.spellings, vocab, max_chars,
                                                               lexicon=lexicon)
    return _HELD_OUT[key]


def evaluate_workdir(workdir: str, eval_files: str) -> dict:
    """Held-out perplexity of the newest checkpoint in `workdir` (the full
    softmax; `train.py evaluate`).

    Args:
        workdir: a training workdir (local or in a bucket).
        eval_files: a glob of held-out text files, one sentence per line.

    Returns:
        {"step", "eval_ppl", "eval_ppl_forward", "eval_ppl_backward",
        "eval_tokens"}.
    """
    run = open_model(workdir)
    params = {"bilm": run.params, "softmax": pad_softmax(run.softmax, len(run.vocab))}
    return {"step": run.step,
            **evaluate(params, run.options, run.config.train, run.vocab, eval_files,
                       lexicon=run.lexicon)}


def unigram_perplexity(train_files: str, vocab: Vocabulary, eval_files: str) -> dict:
    """{"ppl", "predictions"} of the add-one (Laplace) unigram model of
    `train_files` (a glob) on `eval_files` (a glob): the floor a biLM's
    held-out perplexity must beat. It predicts what `evaluate` predicts: each
    sentence's words and one boundary (`</S>` forward, `<S>` backward: both
    occur once a sentence, so the two directions' perplexities are equal),
    over the biLM's vocabulary, unknown words as `<UNK>`."""
    counts = np.zeros(len(vocab), np.int64)
    for path in data_lib.list_shards(train_files):
        for s in data_lib.read_sentences(path):
            np.add.at(counts, vocab.encode(s), 1)
            counts[vocab.eos] += 1
    logp = np.log((counts + 1) / (counts.sum() + len(vocab)))
    total, n = 0.0, 0
    for path in data_lib.list_shards(eval_files):
        for s in data_lib.read_sentences(path):
            total += float(logp[vocab.encode(s)].sum() + logp[vocab.eos])
            n += len(s) + 1
    return {"ppl": math.exp(-total / n), "predictions": n}
