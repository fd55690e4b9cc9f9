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

from elmo_jax import checkpoints
from elmo_jax import export as export_lib
from elmo_jax.config import Config, save_config
from elmo_jax.lexicon import LEXICON_FILE, Lexicon
from elmo_jax.stored import CONFIG_FILE, StoredModel, open_model
from elmo_jax.training.partitioning import cursor_sharding
from elmo_jax.training.steps import TrainState
from elmo_jax.vocab import Vocabulary


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


DATA_FORMAT = "streams-1"  # the data position of `data.StreamBatcher`


def save_checkpoint(mngr, state: TrainState, position: dict, mesh) -> None:
    """Save the state and the data position after the batch the state last
    trained on (`StreamBatcher.position()`: this process's rows' cursors, the
    batches made): the cursors become one global array split by rows, which
    every process writes its part of; no gather. A collective call."""
    cursors = np.asarray(position["cursors"], np.int32)
    checkpoints.save(mngr, state, {
        "json": {"format": DATA_FORMAT, "batches": int(position["batches"]),
                 "batch_size": int(cursors.shape[0]) * jax.process_count()},
        "cursors": jax.make_array_from_process_local_data(cursor_sharding(mesh), cursors)})


def restore_checkpoint(mngr, step: int, abstract_state: TrainState, mesh, batch_size: int
                       ) -> tuple[TrainState, dict]:
    """(state, data position of this process's rows) of checkpoint `step`,
    whatever the number of processes and devices that wrote it, as long as the
    global batch is the same. A position without cursors (a checkpoint whose
    data item was rewritten, as the earlier layout's) gives None for them: the
    batcher finds them again from the batch count."""
    where = os.path.join(str(mngr.directory), str(step))
    abstract = jax.ShapeDtypeStruct((batch_size, 2), np.int32, sharding=cursor_sharding(mesh))
    state, data, cursors = checkpoints.restore(mngr, step, abstract_state, abstract)
    if data.get("format") != DATA_FORMAT:
        raise TrainingError(
            f"the checkpoint at {where} keeps its data position in the format of the earlier "
            "input pipeline, which this version cannot continue: start a new run from it with "
            "--init_from " + os.path.dirname(os.path.dirname(where)))
    if data["batch_size"] != batch_size:
        raise TrainingError(f"the checkpoint at {where} was trained with a global batch of "
                            f"{data['batch_size']} rows; this run has {batch_size}: resume with "
                            f"--batch_size {data['batch_size']} (any number of devices or "
                            "processes)")
    local = None
    if cursors is not None:
        shards = sorted(cursors.addressable_shards, key=lambda s: s.index[0].start or 0)
        seen, parts = set(), []
        for shard in shards:  # replicated over `model`: each row block once
            start = shard.index[0].start or 0
            if start not in seen:
                seen.add(start)
                parts.append(np.asarray(shard.data))
        local = np.concatenate(parts).astype(np.int64)
    return state, {"batches": data["batches"], "cursors": local}


def write_run(workdir: str, config: Config, vocab: Vocabulary, lexicon=None) -> None:
    """Record a new run's resolved config and vocabulary, and the lexicon of a
    model that spells with one (process 0 writes)."""
    if jax.process_index() == 0:
        vocab.to_file(os.path.join(workdir, export_lib.VOCAB_FILE))
        if lexicon is not None:
            lexicon.save(workdir)
        save_config(config, os.path.join(workdir, CONFIG_FILE))


def run_lexicon(workdir: str, options, pretrained: StoredModel | None):
    """The lexicon a run spells with: the pretrained model's (fine-tuning an
    ELMoForManyLangs model), else the workdir's (resuming one), else None."""
    if options.char_cnn.spelling != "lexicon":
        return None
    if pretrained is not None and pretrained.lexicon is not None:
        return pretrained.lexicon
    if os.path.exists(os.path.join(workdir, LEXICON_FILE)):
        return Lexicon.load(workdir)
    raise TrainingError(f"the model spells tokens with a lexicon, and neither --init_from nor "
                        f"{workdir} has one ({LEXICON_FILE})")


def export(workdir: str, out_dir: str) -> dict:
    """The newest checkpoint as an export folder (`export.py`): bilm-tf's /
    AllenNLP's format, with the vocabulary and the softmax (for scoring)."""
    run = open_model(workdir)
    export_lib.save_export(out_dir, run.params, run.options, run.vocab, softmax=run.softmax,
                           lexicon=run.lexicon)
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
    event files without TensorFlow). Process 0 writes, in a thread of its own,
    so that the file system never holds up the step loop; `close` waits for
    every record to be written."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self._queue = None
        self._thread = None
        self._error: BaseException | None = None

    def write(self, record: dict) -> None:
        if jax.process_index() != 0:
            return
        if self._error is not None:
            raise self._error
        if self._thread is None:
            import queue
            import threading

            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._write_all, daemon=True,
                                            name="elmo-jax-metrics")
            self._thread.start()
        self._queue.put(dict(record))

    def _write_all(self) -> None:
        from tensorboardX import SummaryWriter

        writer = None
        try:
            while (record := self._queue.get()) is not None:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                writer = writer or SummaryWriter(self.tensorboard_dir, flush_secs=30)
                for key, value in record.items():
                    if (key != "step" and isinstance(value, (int, float))
                            and not isinstance(value, bool)):
                        writer.add_scalar(key, value, record["step"])
                writer.flush()
        except BaseException as e:  # the next write raises it
            self._error = e
        finally:
            if writer is not None:
                writer.close()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
