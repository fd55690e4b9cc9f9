"""A training run's folder, as training writes and resumes it: the run's
config and vocabulary, checkpoints with every process's data position
(`elmo_jax/checkpoints.py` owns their layout), the export of the newest
checkpoint, a pretrained starting point for fine-tuning, and the metrics log.

    WORKDIR/config.json       the resolved config (model options with n_tokens_vocab)
    WORKDIR/vocab.txt         the vocabulary the softmax was trained with
    WORKDIR/metrics.jsonl     one JSON record per log or evaluation event
    WORKDIR/tensorboard/      the same numbers as TensorBoard scalars
    WORKDIR/checkpoints/STEP  orbax: params/, train/ (the rest of the TrainState), data/

Reading a model from a workdir is `stored.open_model`'s job.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from elmo_jax import checkpoints
from elmo_jax import export as export_lib
from elmo_jax.config import Config, save_config
from elmo_jax.stored import CONFIG_FILE, StoredModel, open_model
from elmo_jax.training.steps import TrainState
from elmo_jax.vocab import Vocabulary


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


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
    """Save the state and every process's data position (a collective call;
    see `checkpoints.save`)."""
    checkpoints.save(mngr, state, gather_json(data_position))


def restore_checkpoint(mngr, step: int, abstract_state: TrainState) -> tuple[TrainState, dict]:
    """(state, this process's data position) of checkpoint `step`, which must
    come from as many processes as this run has."""
    state, data = checkpoints.restore(mngr, step, abstract_state)
    if data["process_count"] != jax.process_count():
        where = os.path.join(str(mngr.directory), str(step))
        raise TrainingError(f"the checkpoint at {where} was written by "
                            f"{data['process_count']} processes; this run has "
                            f"{jax.process_count()}")
    return state, data["positions"][jax.process_index()]


def write_run(workdir: str, config: Config, vocab: Vocabulary) -> None:
    """Record a new run's resolved config and vocabulary (process 0 writes)."""
    if jax.process_index() == 0:
        vocab.to_file(os.path.join(workdir, export_lib.VOCAB_FILE))
        save_config(config, os.path.join(workdir, CONFIG_FILE))


def export(workdir: str, out_dir: str) -> dict:
    """The newest checkpoint as an export folder (`export.py`): bilm-tf's /
    AllenNLP's format, with the vocabulary and the softmax (for scoring)."""
    run = open_model(workdir)
    export_lib.save_export(out_dir, run.params, run.options, run.vocab, softmax=run.softmax)
    return {"step": run.step, "out_dir": out_dir}


def load_pretrained(init_from: str, vocab: Vocabulary) -> StoredModel:
    """--init_from: a training workdir, an export folder, or a weights hdf5
    with options.json beside it; its softmax is kept only when its vocabulary
    is `vocab`."""
    model = open_model(init_from)
    same = model.vocab is not None and model.vocab.words == vocab.words
    return model if same else model._replace(softmax=None)


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
