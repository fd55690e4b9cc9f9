"""A training run's folder, as training writes and resumes it: the run's
config and vocabulary, checkpoints with every process's data position
(`elmo_jax/formats/checkpoints.py` owns their layout), the export of the newest
checkpoint, a pretrained starting point for fine-tuning, and the metrics log.

    WORKDIR/config.json       the resolved config (model options with n_tokens_vocab)
    WORKDIR/vocab.txt         the vocabulary the softmax was trained with
    WORKDIR/metrics.jsonl     one JSON record per log or evaluation event
    WORKDIR/tensorboard/      the same numbers as TensorBoard scalars
    WORKDIR/checkpoints/STEP  orbax: params/, train/ (the rest of the TrainState), data/

Reading a model from a workdir is `formats.stored_model.open_model`'s job.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from elmo_jax.formats import checkpoints
from elmo_jax.storage import copies, paths
from elmo_jax.formats import export as export_lib
from elmo_jax.config import Config, save_config
from elmo_jax.errors import UserError
from elmo_jax.core.lexicon import LEXICON_FILE, Lexicon
from elmo_jax.formats.stored_model import CONFIG_FILE, StoredModel, open_model
from elmo_jax.formats.serving import export_model
from elmo_jax.training.partitioning import cursor_sharding
from elmo_jax.training.steps import TrainState
from elmo_jax.core.vocab import Vocabulary


class TrainingError(UserError, RuntimeError):
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
    where = paths.join(str(mngr.directory), str(step))
    abstract = jax.ShapeDtypeStruct((batch_size, 2), np.int32, sharding=cursor_sharding(mesh))
    state, data, cursors = checkpoints.restore(mngr, step, abstract_state, abstract)
    if data.get("format") != DATA_FORMAT:
        raise TrainingError(
            f"the checkpoint at {where} keeps its data position in the format of the earlier "
            "input pipeline, which this version cannot continue: start a new run from it with "
            "--init_from " + paths.dirname(paths.dirname(where)))
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
        vocab.to_file(paths.join(workdir, export_lib.VOCAB_FILE))
        if lexicon is not None:
            lexicon.save(workdir)
        save_config(config, paths.join(workdir, CONFIG_FILE))


def run_lexicon(workdir: str, options, pretrained: StoredModel | None):
    """The lexicon a run spells with: the pretrained model's (fine-tuning an
    ELMoForManyLangs model), else the workdir's (resuming one), else None."""
    if options.char_cnn.spelling != "lexicon":
        return None
    if pretrained is not None and pretrained.lexicon is not None:
        return pretrained.lexicon
    if paths.exists(paths.join(workdir, LEXICON_FILE)):
        return Lexicon.load(workdir)
    raise TrainingError(f"the model spells tokens with a lexicon, and neither --init_from nor "
                        f"{workdir} has one ({LEXICON_FILE})")


def export(workdir: str, out_dir: str) -> dict:
    """The newest checkpoint as an export folder in bilm-tf's and AllenNLP's
    format, with the vocabulary and the softmax (for scoring): `export_model`
    of a run.

    Args:
        workdir: a training workdir (local or in a bucket).
        out_dir: the new (or empty) export folder (local or in a bucket).

    Returns:
        {"format": "bilm-tf", "out_dir": out_dir, "step": the checkpoint's step}.
    """
    return export_model(workdir, out_dir, "bilm-tf")


def load_pretrained(init_from: str, vocab: Vocabulary) -> StoredModel:
    """--init_from: a training workdir, an export folder, or a weights hdf5
    with options.json beside it; its softmax is kept only when its vocabulary
    is `vocab`."""
    model = open_model(init_from)
    same = model.vocab is not None and model.vocab.words == vocab.words
    return model if same else model._replace(softmax=None)


# what a checkpoint fixes: the model (its options but the limits), and of the
# train section what only the first step reads; the vocabulary is checked
# word by word (`loop._resolve_model`)
FREE_MODEL_FIELDS = ("n_epochs", "n_train_tokens")
FIXED_TRAIN_FIELDS = ("seed", "initial_accumulator_value", "softmax_init")
FIXED_DATA_FIELDS = ("init_from", "tokenize")


def flat_settings(d: dict, prefix: str = "") -> dict:
    """{"model.lstm.dim": 4096, ...}: a nested config dict's leaves by path."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_on_resume(requested: Config, saved: Config, workdir: str) -> tuple[Config, dict]:
    """(the config a resumed run goes on with, {setting: [saved, requested]}
    for each setting that changes). A setting the checkpoint fixes that
    differs is a ConfigError (one line each, with the way out); any other is
    applied: the learning rate, the cadences, the limits, the mesh."""
    from elmo_jax.config import ConfigError

    old, new = flat_settings(saved.to_dict()), flat_settings(requested.to_dict())
    fixed = lambda k: ((k.startswith("model.") and k.split(".")[1] not in FREE_MODEL_FIELDS)
                       or k in {f"train.{f}" for f in FIXED_TRAIN_FIELDS}
                       or k in {f"data.{f}" for f in FIXED_DATA_FIELDS})
    changed = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
               if old.get(k) != new.get(k) and k != "description"}
    refused = [k for k in changed if fixed(k)]
    if refused:
        raise ConfigError("\n".join(
            [f"{workdir} was trained with {k} {json.dumps(changed[k][0])}; this command asks "
             f"for {json.dumps(changed[k][1])}" for k in refused]
            + ["a checkpoint fixes the model, the global batch, the seed and the vocabulary: "
               f"resume with the run's own settings ({paths.join(workdir, CONFIG_FILE)}), or "
               f"start a new run from it: --init_from {workdir} --workdir NEW_DIR"]))
    return requested, changed


def read_metrics(workdir: str) -> list[dict]:
    """WORKDIR/metrics.jsonl's records as the run's one history: a restart
    writes a "resumed" record, and the records of steps after its checkpoint
    written before it (steps trained again) are dropped; so are those a
    non-finite loss sent the run back over ("nonfinite_loss")."""
    records: list[dict] = []
    with paths.open(paths.join(workdir, METRICS_FILE), "rb") as fh:
        for line in fh.read().decode("utf-8").splitlines():
            record = json.loads(line)
            back_to = {"resumed": record.get("from_step"),
                       "nonfinite_loss": record.get("back_to_step")}.get(record.get("event"))
            if back_to is not None:
                records = [r for r in records if r.get("step", 0) <= back_to]
            records.append(record)
    return records


METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """WORKDIR/metrics.jsonl, one JSON record per log or evaluation event, and
    the same numbers as TensorBoard scalars in WORKDIR/tensorboard (tensorboardX:
    event files without TensorFlow). Process 0 writes, in a thread of its own,
    so that the file system never holds up the step loop; `close` waits for
    every record to be written. A resumed run's log starts at `purge_step`:
    TensorBoard drops the earlier run's points from there on (`read_metrics`
    does the same for metrics.jsonl).

    In a bucket, where an object cannot be appended to, both are written in a
    local mirror and uploaded whole whenever the queue of records runs dry
    (`copies.Mirror`): the bucket's metrics.jsonl is always whole, at most the
    records of the last moments behind, which a resumed run trains again."""

    def __init__(self, workdir: str, purge_step: int | None = None):
        self.workdir = paths.check(workdir)
        self.purge_step = purge_step
        self._queue = None
        self._thread = None
        self._error: BaseException | None = None
        self._upload_at_close = True

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

        writer = mirror = None
        try:
            mirror = copies.Mirror(self.workdir, fetch=(METRICS_FILE,))
            while (record := self._queue.get()) is not None:
                with open(os.path.join(mirror.local, METRICS_FILE), "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                writer = writer or SummaryWriter(os.path.join(mirror.local, "tensorboard"),
                                                 flush_secs=30, purge_step=self.purge_step)
                for key, value in record.items() if record.get("event") != "resumed" else ():
                    if (key != "step" and isinstance(value, (int, float))
                            and not isinstance(value, bool)):
                        writer.add_scalar(key, value, record["step"])
                writer.flush()
                if self._queue.empty():
                    mirror.sync()
        except BaseException as e:  # the next write raises it
            self._error = e
        finally:
            if writer is not None:
                writer.close()
            if mirror is not None:
                try:
                    mirror.close(sync=self._error is None and self._upload_at_close)
                except BaseException as e:
                    self._error = self._error or e

    def close(self, upload: bool = True) -> None:
        """Wait for every record to be written; `upload` False leaves a
        bucket's copy as it last was (the storage has stopped answering: one
        more upload would only wait out its retries again)."""
        self._upload_at_close = upload
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
