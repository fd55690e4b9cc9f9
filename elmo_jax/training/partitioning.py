"""Where the arrays live: the device mesh, the shardings, the global batch,
and `create_train_step`, the one place the jitted, sharded train step is built
(`train.py`, `bench/train.py` and `bench/gpu.py` all time and run this step).

The batch is split over every device (the `data` and `model` axes together:
`ROWS`) and the parameters replicated, except the softmax matrix, its bias and
their optimizer slots, whose rows are split over the `model` axis (the losses
gather the rows they need from the shards: `softmax.py`). The same code runs on one CPU, simulated CPU
devices, a GPU or a TPU slice, and over several hosts.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax.config import TrainConfig
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.softmax import ROWS, SOFTMAX_ROW_MULTIPLE, softmax_rows
from elmo_jax.training.steps import TrainState, init_train_state, make_optimizer, train_step


LARGE_SOFTMAX = 2 ** 24  # parameters of the softmax matrix from which it is split by default


def auto_mesh_model(vocab_size: int, options: ElmoOptions, n_devices: int,
                    devices_per_host: int = 8) -> int:
    """`train.mesh_model: 0`: 1 for a small softmax; for a large one (the 1B Word
    Benchmark's 793,471 x 512 words) the largest power of two up to 8, and up
    to one host's devices (the softmax shards exchange rows every step), that
    divides the devices, so that the matrix, its gradient and its Adagrad
    accumulator are split and its rows never gathered."""
    if vocab_size * options.lstm.projection_dim < LARGE_SOFTMAX:
        return 1
    m = 1
    while m * 2 <= min(8, devices_per_host) and n_devices % (m * 2) == 0:
        m *= 2
    return m


def device_grid(devices, mesh_model: int) -> np.ndarray:
    """`devices` as a [data, model] grid that fits the hardware: each host's
    devices a block of whole rows (the model axis inside a host, where its
    exchanges stay on the host's own links, and each process's batch rows one
    contiguous block), and within a host the order of its interconnect
    (`mesh_utils.create_device_mesh`: a TPU host's chips in ring order), the
    same for every host, so that each data-axis group holds the chips at one
    place of every host (a TPU's ICI routes the collectives of such regular
    groups; libtpu refuses irregular ones). Falls back to the given order where
    hosts differ in size, the model axis is wider than a host, or the topology
    has no ring order for the shape (TPU v4's two TensorCores a chip)."""
    devices = list(devices)
    if len(devices) % mesh_model:
        raise ValueError(f"mesh_model={mesh_model} does not divide the {len(devices)} devices")
    hosts: dict = {}
    for d in devices:
        hosts.setdefault(d.process_index, []).append(d)
    sizes = {len(h) for h in hosts.values()}
    if len(sizes) != 1 or sizes.pop() % mesh_model:
        return np.array(devices).reshape(-1, mesh_model)
    hosts = [hosts[k] for k in sorted(hosts)]
    shape = (len(hosts[0]) // mesh_model, mesh_model)
    try:
        first = mesh_utils.create_device_mesh(shape, hosts[0], allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
        first = np.array(hosts[0]).reshape(shape)
    layout = [_place_in_host(d, hosts[0]) for d in first.flat]
    blocks = [first]
    for host in hosts[1:]:
        places = {_place_in_host(d, host): d for d in host}
        if None in layout or set(places) != set(layout):  # no coordinates: as given
            blocks.append(np.array(host).reshape(shape))
        else:
            blocks.append(np.array([places[p] for p in layout]).reshape(shape))
    return np.concatenate(blocks, axis=0)


def _place_in_host(device, host) -> tuple | None:
    """A device's coordinates relative to its host's first corner (and its core
    on the chip), or None for a device without coordinates."""
    if getattr(device, "coords", None) is None:
        return None
    corner = np.min([d.coords for d in host], axis=0)
    return (*(np.asarray(device.coords) - corner).tolist(), getattr(device, "core_on_chip", 0))


def make_mesh(mesh_model: int = 1, devices=None) -> Mesh:
    """A ("data", "model") mesh of `devices` (default: all) with `mesh_model`
    devices on the model axis, laid out by `device_grid`."""
    devices = list(devices if devices is not None else jax.devices())
    return Mesh(device_grid(devices, mesh_model), ("data", "model"))


def model_axis_hosts(mesh: Mesh) -> int:
    """The most hosts any one model-axis group spans (1: every group in one host)."""
    grid = mesh.devices.reshape(-1, mesh.shape["model"])
    return max(len({d.process_index for d in row}) for row in grid)


def train_mesh(options: ElmoOptions, config: TrainConfig, vocab_size: int) -> Mesh:
    """The mesh training runs on: every device, `config.mesh_model` of them on
    the model axis (0: `auto_mesh_model`)."""
    return make_mesh(config.mesh_model
                     or auto_mesh_model(vocab_size, options, jax.device_count(),
                                        jax.local_device_count()))


def state_shardings(abstract_state: TrainState, mesh: Mesh) -> TrainState:
    """Replicated parameters, LSTM state split by batch row, softmax rows split
    over `model` (optimizer slots follow their parameters)."""
    def spec(path, leaf):
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        if "lstm_state" in keys:
            return lstm_state_sharding(mesh)
        if "softmax" in keys and getattr(leaf, "ndim", 0) >= 1:
            return NamedSharding(mesh, P("model"))
        return NamedSharding(mesh, P())
    return jax.tree_util.tree_map_with_path(spec, abstract_state)


def batch_shardings(mesh: Mesh) -> dict:
    """Shardings of a batch (`data.streams`' layout): one row group (and its
    token table) per device."""
    return {"token_chars": NamedSharding(mesh, P(ROWS)),
            "token_index": NamedSharding(mesh, P(None, ROWS)),
            "targets": NamedSharding(mesh, P(None, ROWS)),
            "mask": NamedSharding(mesh, P(ROWS))}


def abstract_batch(mesh: Mesh, batch_size: int, unroll_steps: int,
                   table: tuple[int, int]) -> dict:
    """ShapeDtypeStructs (with shardings) of a global batch of `batch_size`
    rows whose token tables are `table` (rows, characters): what a step is
    compiled for ahead of time."""
    B, U = batch_size, unroll_steps
    shapes = {"token_chars": ((mesh.size, *table), np.int32),
              "token_index": ((2, B, U), np.int32), "targets": ((2, B, U), np.int32),
              "mask": ((B, U), np.bool_)}
    shardings = batch_shardings(mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=shardings[k])
            for k, (shape, dtype) in shapes.items()}


def lstm_state_sharding(mesh: Mesh) -> NamedSharding:
    """LSTMState leaves [L, 2, B, .]: rows split like the batch."""
    return NamedSharding(mesh, P(None, None, ROWS))


def cursor_sharding(mesh: Mesh) -> NamedSharding:
    """[B, 2] per-row data cursors (`data.StreamBatcher`): rows split like the batch."""
    return NamedSharding(mesh, P(ROWS))


def process_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
    """The global batch rows [start, stop) this process feeds (one block:
    `device_grid` puts each host's devices in whole rows of the mesh)."""
    index = cursor_sharding(mesh).addressable_devices_indices_map((batch_size, 2))
    starts = sorted({(s[0].start or 0, s[0].stop or batch_size) for s in index.values()})
    start, stop = starts[0][0], starts[-1][1]
    if sum(b - a for a, b in starts) != stop - start:
        raise ValueError(f"this process's batch rows are not one block: {starts}")
    return start, stop


def global_batch(local: dict, mesh: Mesh) -> dict:
    """Host-local numpy batch -> global arrays (each process holds its rows;
    the token tables must have one shape in every process: evaluation's are
    padded to a fixed one, training's agreed by `feeding.Feeder`)."""
    shardings = batch_shardings(mesh)
    return {k: jax.make_array_from_process_local_data(shardings[k], v) for k, v in local.items()}


def check_divisible(options: ElmoOptions, vocab_size: int, mesh: Mesh) -> None:
    """The batch splits over data shards and processes, the softmax rows over `model`."""
    n_rows, n_model = mesh.size, mesh.shape["model"]
    if options.batch_size % n_rows or n_rows % jax.process_count():
        processes = "1 process" if jax.process_count() == 1 else f"{jax.process_count()} processes"
        raise ValueError(f"batch_size {options.batch_size} must divide evenly over the "
                         f"{n_rows} devices and {processes}")
    if softmax_rows(vocab_size) % n_model:
        raise ValueError(f"the softmax's {softmax_rows(vocab_size)} rows (the vocabulary, "
                         f"padded to a multiple of {SOFTMAX_ROW_MULTIPLE}) do not divide over "
                         f"mesh_model={n_model}: use a power of two")


class TrainStep(NamedTuple):
    """What `create_train_step` builds."""
    step: Callable            # (state, global batch) -> (state, metrics); donates the state
    init: Callable            # (bilm params or None, softmax params or None) -> sharded state
    abstract_state: TrainState  # shapes, dtypes and shardings of the state (for restoring)
    shardings: TrainState


def create_train_step(options: ElmoOptions, config: TrainConfig, vocab_size: int,
                      mesh: Mesh) -> TrainStep:
    """The jitted train step over `mesh` for `options.batch_size` global rows.

    Args:
        options: the model's `ElmoOptions` (batch_size, unroll_steps,
            negatives, clipping).
        config: the `TrainConfig` (learning rate, softmax, dtype).
        vocab_size: the softmax's rows.
        mesh: a `Mesh` with "data" and "model" axes (`check_divisible` says
            what it must divide).

    Returns:
        A `TrainStep`: `step(state, batch) -> (state, metrics)` (donates the
        state), `init(bilm, softmax)` -> the sharded state, and the state's
        abstract shapes and shardings (for restoring).
    """
    abstract = jax.eval_shape(lambda: init_train_state(options, config, vocab_size))
    shardings = state_shardings(abstract, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract, shardings)
    tx = make_optimizer(options, config)
    step = jax.jit(functools.partial(train_step, options=options, config=config, tx=tx,
                                     mesh=mesh),
                   in_shardings=(shardings, batch_shardings(mesh)),
                   out_shardings=(shardings, None), donate_argnums=0)
    init = jax.jit(functools.partial(init_train_state, options, config, vocab_size),
                   out_shardings=shardings)
    return TrainStep(step, init, abstract, shardings)
