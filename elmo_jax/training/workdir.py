"""A training run's folder: orbax checkpoints, the resolved config, the
vocabulary, the metrics log; restoring the newest checkpoint, exporting it,
and loading a pretrained starting point for fine-tuning.

    WORKDIR/config.json       the resolved config (model options with n_tokens_vocab)
    WORKDIR/vocab.txt         the vocabulary the softmax was trained with
    WORKDIR/metrics.jsonl     one JSON record per log or evaluation event
    WORKDIR/tensorboard/      the same numbers as TensorBoard scalars
    WORKDIR/checkpoints/STEP  orbax: the TrainState and every process's data position
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from elmo_jax import export as export_lib
from elmo_jax.config import Config, ConfigError, config_from_dict, save_config
from elmo_jax.options import ElmoOptions
from elmo_jax.training.partitioning import create_train_step, make_mesh
from elmo_jax.training.steps import TrainState
from elmo_jax.vocab import Vocabulary

CONFIG_FILE = "config.json"


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


def checkpoint_manager(workdir: str, max_to_keep: int = 3) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def gather_json(obj) -> list:
    """The same JSON-able object from every process, in process order."""
    if jax.process_count() == 1:
        return [obj]
    raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    n = int(np.max(multihost_utils.process_allgather(np.array([raw.size]))))
    padded = np.zeros(n, np.uint8)
    padded[:raw.size] = raw
    every = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in every]


def save_checkpoint(mngr, state: TrainState, data_position: dict) -> None:
    """Save the state and every process's data position (a collective call)."""
    positions = gather_json(data_position)
    mngr.save(int(state.step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"process_count": len(positions), "positions": positions})),
        force=True)
    mngr.wait_until_finished()


def restore_checkpoint(mngr, step: int, abstract_state: TrainState,
                       resume: bool = True) -> tuple[TrainState, dict | None]:
    """(state, this process's data position) of checkpoint `step`. To resume
    training, the checkpoint must come from as many processes as this run has;
    to read the model only (`resume=False`) any number will do."""
    where = os.path.join(str(mngr.directory), str(step))
    try:
        out = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many kinds; all mean the same to the user
        raise TrainingError(
            f"the checkpoint at {where} cannot be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:300] if str(e) else ''}). Nothing was changed: move that "
            "step directory away to resume from an earlier checkpoint, or use another --workdir."
        ) from None
    positions = out["data"]
    if not resume:
        return out["state"], None
    if positions["process_count"] != jax.process_count():
        raise TrainingError(f"the checkpoint at {where} was written by "
                            f"{positions['process_count']} processes; this run has "
                            f"{jax.process_count()}")
    return out["state"], positions["positions"][jax.process_index()]


def write_run(workdir: str, config: Config, vocab: Vocabulary) -> None:
    """Record a new run's resolved config and vocabulary (process 0 writes)."""
    if jax.process_index() == 0:
        vocab.to_file(os.path.join(workdir, export_lib.VOCAB_FILE))
        save_config(config, os.path.join(workdir, CONFIG_FILE))


def read_run(workdir: str) -> tuple[Config, Vocabulary]:
    """The resolved config and the vocabulary of the run in `workdir`."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise TrainingError(f"{workdir} holds no training run (no {CONFIG_FILE})")
    with open(path, encoding="utf-8") as fh:
        try:
            config = config_from_dict(json.load(fh))
        except (ConfigError, ValueError) as e:
            raise TrainingError(f"{path}: {e}") from None
    return config, Vocabulary.from_file(os.path.join(workdir, export_lib.VOCAB_FILE))


class Restored(NamedTuple):
    config: Config
    vocab: Vocabulary
    state: TrainState


def restore_latest(workdir: str, devices=None) -> Restored:
    """The newest checkpoint of `workdir`, on `devices` (default: this
    process's first device), with the run's config and vocabulary."""
    config, vocab = read_run(workdir)
    step = checkpoint_manager(workdir).latest_step()
    if step is None:
        raise TrainingError(f"{workdir} has no checkpoint yet")
    mesh = make_mesh(1, devices if devices is not None else jax.local_devices()[:1])
    built = create_train_step(config.model, config.train, len(vocab), mesh)
    state, _ = restore_checkpoint(checkpoint_manager(workdir), step, built.abstract_state,
                                  resume=False)
    return Restored(config, vocab, state)


def export(workdir: str, out_dir: str) -> dict:
    """The newest checkpoint as an export folder (`export.py`): bilm-tf's /
    AllenNLP's format, with the vocabulary and the softmax (for scoring)."""
    run = restore_latest(workdir)
    export_lib.save_export(out_dir, run.state.params["bilm"], run.config.model, run.vocab,
                           softmax=vocabulary_softmax(run.state.params["softmax"], run.vocab))
    return {"step": int(run.state.step), "out_dir": out_dir}


def vocabulary_softmax(softmax: dict, vocab: Vocabulary) -> dict:
    """The softmax's rows of the vocabulary's words (the state's matrix is padded)."""
    return {"w": softmax["w"][:len(vocab)], "b": softmax["b"][:len(vocab)]}


class Pretrained(NamedTuple):
    options: ElmoOptions
    bilm: dict
    softmax: dict | None   # kept only when the vocabulary is the same


def load_pretrained(init_from: str, vocab: Vocabulary) -> Pretrained:
    """--init_from: a training workdir, an export folder, or a weights hdf5
    with options.json beside it."""
    if os.path.isdir(init_from) and os.path.exists(os.path.join(init_from, CONFIG_FILE)):
        run = restore_latest(init_from)  # on this process's own device, then to the host:
        params = jax.device_get(run.state.params)  # every process places it on the mesh
        same = run.vocab.words == vocab.words
        return Pretrained(run.config.model, params["bilm"],
                          vocabulary_softmax(params["softmax"], vocab) if same else None)
    exported = export_lib.load_export(init_from)
    same = exported.vocab is not None and exported.vocab.words == vocab.words
    return Pretrained(exported.options, exported.params, exported.softmax if same else None)


class MetricsLog:
    """WORKDIR/metrics.jsonl, one JSON record per log or evaluation event, and
    the same numbers as TensorBoard scalars in WORKDIR/tensorboard (tensorboardX:
    event files without TensorFlow). Process 0 writes."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self._writer = None

    def write(self, record: dict) -> None:
        if jax.process_index() != 0:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(self.tensorboard_dir, flush_secs=30)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, record["step"])
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
