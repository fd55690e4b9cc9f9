"""A training run's orbax checkpoints: the one layout training writes and
every reader of a model reads.

    WORKDIR/checkpoints/STEP/params/  the parameters {"bilm", "softmax"} (softmax rows padded)
    WORKDIR/checkpoints/STEP/train/   the rest of the TrainState: step, opt_state,
                                      lstm_state, rng
    WORKDIR/checkpoints/STEP/data/    where the run is in its data (JSON: batches made)
    WORKDIR/checkpoints/STEP/cursors/ each batch row's place in its stream [B, 2], saved
                                      and restored split by rows like the batch, so any
                                      number of processes resumes it (`data.streams`)

The parameters are an item of their own so that reading a model needs no
optimizer and no train step: their shapes come from the checkpoint's metadata.
Saves are atomic: a step directory appears only once whole, so a process
killed during a save resumes from the checkpoint before. They can be
asynchronous (orbax copies the arrays to the host, then writes the files in
threads while training goes on): by default on accelerators, whose host idles
during a step; on a CPU host the step uses every core and the writes only slow
it (BENCHMARKS.md, "Checkpoint saves").
"""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from elmo_jax import errors
from elmo_jax.storage import clients, paths
from elmo_jax.errors import UserError

CHECKPOINT_DIR = "checkpoints"

TRAIN_FIELDS = ("step", "opt_state", "lstm_state", "rng")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing or cannot be read; the message says what to do."""


def checkpoint_dir(workdir: str) -> str:
    """WORKDIR/checkpoints: absolute when local, as given in a gs:// bucket
    (orbax writes there directly: each process its part, committed by a
    marker object, the way orbax commits on GCS). An s3:// workdir is refused:
    orbax 0.12 cannot write checkpoints to S3."""
    workdir = paths.check(workdir)
    if paths.scheme(workdir) == "s3":
        raise CheckpointError(
            f"{workdir}: checkpoints cannot be written to s3:// (orbax 0.12 turns s3://B into "
            "s3:/B); train with a --workdir in gs:// or on a folder every host shares (NFS, "
            "Lustre, EFS), and keep data, exports and stores on s3://")
    if paths.is_remote(workdir):
        return paths.join(workdir, CHECKPOINT_DIR)
    return os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))


def manager(workdir: str, max_to_keep: int = 3,
            asynchronous: bool | None = None) -> ocp.CheckpointManager:
    """The workdir's checkpoint manager; `asynchronous` None: when JAX's
    backend is not the CPU."""
    if asynchronous is None:
        asynchronous = jax.default_backend() != "cpu"
    from elmo_jax.private_apis import first_replica_checkpoint_handler

    clients.forget_listings(workdir)
    # every array written by its first replica: no slicing programs compiled mid-run
    arrays = {name: first_replica_checkpoint_handler()
              for name in ("params", "train", "cursors")}
    return ocp.CheckpointManager(
        checkpoint_dir(workdir),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=asynchronous),
        item_handlers={**arrays, "data": ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, state, data: dict) -> None:
    """Save `state` (a TrainState) and the data position: `data["json"]` (the
    same on every process) and `data["cursors"]`, a global [B, 2] array (a
    collective call). Asynchronous, it returns once the arrays are on the host
    and the files are written in the background (`mngr.wait_until_finished()`
    waits for them)."""
    train = {k: getattr(state, k) for k in TRAIN_FIELDS}
    items = dict(params=ocp.args.StandardSave(state.params), train=ocp.args.StandardSave(train),
                 data=ocp.args.JsonSave(data["json"]))
    if data.get("cursors") is not None:
        items["cursors"] = ocp.args.StandardSave({"cursors": data["cursors"]})
    try:
        mngr.save(int(state.step), args=ocp.args.Composite(**items), force=True)
    except UserError:
        raise
    except Exception as e:  # tensorstore's and gcsfs's, once their own retries are spent
        if not paths.is_remote(str(mngr.directory)):
            raise
        raise errors.StorageError(
            f"the checkpoint of step {int(state.step)} could not be written to "
            f"{mngr.directory} ({type(e).__name__}: {clients.first_line(e)}): training stopped. "
            "Its newest whole checkpoint is kept: run the same command again once the storage "
            "answers, and it resumes from there") from None


def _unreadable(where: str, e: Exception) -> CheckpointError:
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return CheckpointError(
        f"the checkpoint at {where} cannot be read ({type(e).__name__}: {first}). Nothing was "
        "changed: move that step directory away to resume from an earlier checkpoint, or use "
        "another --workdir.")


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state, abstract_cursors=None):
    """(TrainState, data JSON, cursors or None) of checkpoint `step`, laid out
    as `abstract_state` and `abstract_cursors` (ShapeDtypeStructs with
    shardings) say; cursors are None where the checkpoint has none."""
    where = paths.join(str(mngr.directory), str(step))
    cursors = None
    try:
        train = {k: getattr(abstract_state, k) for k in TRAIN_FIELDS}
        items = dict(params=ocp.args.StandardRestore(abstract_state.params),
                     train=ocp.args.StandardRestore(train), data=ocp.args.JsonRestore())
        has_cursors = paths.isdir(paths.join(where, "cursors"))
        if has_cursors and abstract_cursors is not None:
            items["cursors"] = ocp.args.StandardRestore({"cursors": abstract_cursors})
        out = mngr.restore(step, args=ocp.args.Composite(**items))
        if "cursors" in items:
            cursors = out["cursors"]["cursors"]
    except Exception as e:  # orbax raises many kinds; all mean the same to the user
        raise _unreadable(where, e) from None
    return abstract_state.replace(params=out["params"], **out["train"]), out["data"], cursors


def latest_step(workdir: str) -> int | None:
    """The newest whole checkpoint of `workdir` (None: none yet)."""
    directory = checkpoint_dir(workdir)
    if not paths.isdir(directory):
        return None
    clients.forget_listings(directory)
    return ocp.CheckpointManager(directory).latest_step()


def read_params(workdir: str, step: int | None = None) -> tuple[int, dict]:
    """(step, {"bilm": ..., "softmax": {"w": [R, P], "b": [R]}}) as numpy
    arrays, from checkpoint `step` (default: the newest). Nothing of training
    is built; the softmax keeps its padding rows (`softmax.unpad_softmax`)."""
    step = latest_step(workdir) if step is None else step
    if step is None:
        raise CheckpointError(f"{workdir} has no checkpoint yet")
    where = paths.join(checkpoint_dir(workdir), str(step))
    item = paths.join(where, "params")
    # the item's handler, not a Checkpointer: a Checkpointer looks for the
    # step's metadata inside the item and warns that it is not there
    handler, item = ocp.PyTreeCheckpointHandler(), epath.Path(item)
    try:
        tree = handler.metadata(item).tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        params = handler.restore(item, args=ocp.args.PyTreeRestore(
            item=tree, restore_args=as_numpy))
    except Exception as e:
        raise _unreadable(where, e) from None
    return step, params
