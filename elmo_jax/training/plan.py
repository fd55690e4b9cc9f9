"""A plan before a pod: compile the train step ahead of time for a mesh and
report what each device must hold and what an epoch costs. Nothing runs: the
devices are simulated CPU devices, or with `target` a TPU slice's or GPU
hosts' own chips, compiled for by their own compiler (libtpu; the CUDA PJRT
plugin) on this host (`targets.py`).

    python train.py plan --config original --vocab_size 793471 --mesh data=8,model=8
    python train.py plan --config original --vocab_size 793471 --target v5e-8 --mesh model=8

With a target the plan also gives the chip's memory (does the program fit;
with `largest_batch`, the most rows per chip that do, by bisection), the
collectives in the optimized program (kind, count, bytes), the target
compiler's own FLOP count, the epoch at 40% and 60% of the chips' peak, and
the `embed` program compiled for the same chips.

Per device: the parameters, the optimizer state and the LSTM state (from the
state's shardings), and the compiled program's own figures (arguments, outputs,
temporaries: XLA's memory analysis of the per-device program). Per step: the
useful FLOPs (counted from the model: XLA's cost analysis counts a loop body
once), and the time of one epoch of the 1B Word Benchmark (768,648,884 training
tokens, bilm-tf's n_train_tokens) at a stated utilisation of named
accelerators' peak matmul throughput.
"""
from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np

from elmo_jax.config import Config, ConfigError
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.batching import round_up
from elmo_jax.training.partitioning import (abstract_batch, create_train_step, make_mesh,
                                            model_axis_hosts)
from elmo_jax.training.targets import TARGETS, Target, compile_only_devices

LM1B_TRAIN_TOKENS = 768_648_884

# The simulated plan's epoch on named chips (one simulated device a chip), at
# their peaks in targets.TARGETS
PEAK_CHIPS = {"H100-SXM": "h100x8", "A100-SXM": "a100x8", "TPU-v5e": "v5e-8",
              "TPU-v5p": "v5p-128", "TPU-v6e": "v6e-8"}


def forward_flops_per_token(options: ElmoOptions) -> dict:
    """2 x multiply-adds of one token through the biLM (no softmax): the token
    encoder once, and each LSTM layer in both directions."""
    c, lo = options.char_cnn, options.lstm
    E, F, P, D = c.embedding_dim, c.n_filters, lo.projection_dim, lo.dim
    C = c.max_characters_per_token
    cnn = sum(2 * (C - w + 1) * w * E * n for w, n in c.filters)
    highway = c.n_highway * 2 * (2 * F * F)
    proj = 2 * F * P
    lstm_layer = 2 * (P * 4 * D) + 2 * (P * 4 * D) + 2 * (D * P)  # input, recurrent, projection
    return {"token_encoder": cnn + highway + proj, "lstm": 2 * lo.n_layers * lstm_layer}


def train_flops(options: ElmoOptions, vocab_size: int, full_softmax: bool, positions: int,
                encoded_tokens: float) -> float:
    """Forward + backward (3x the forward) of a step: the LSTMs and the softmax
    of both directions at each window position, the token encoder for each
    token it encodes."""
    f = forward_flops_per_token(options)
    classes = vocab_size if full_softmax else options.n_negative_samples_batch + 1
    softmax = 2 * 2 * classes * options.lstm.projection_dim
    return 3 * (positions * (f["lstm"] + softmax) + encoded_tokens * f["token_encoder"])


def train_flops_per_token(options: ElmoOptions, vocab_size: int, full_softmax: bool) -> float:
    """`train_flops` per window position, the token encoder counted twice per
    position (an upper bound: batches encode each distinct token once)."""
    return train_flops(options, vocab_size, full_softmax, 1, 2)


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of sharded abstract arrays."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shape, dtype=np.int64)) * leaf.dtype.itemsize
    return total


def _abstract_batch(options: ElmoOptions, mesh) -> dict:
    """The largest batch: every position of a row group a distinct token."""
    S, B, U = mesh.size, options.batch_size, options.unroll_steps
    table = round_up(2 * (B // S) * U + 1, 128)
    return abstract_batch(mesh, B, U, (table, options.char_cnn.max_characters_per_token))


_COLLECTIVE = re.compile(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|"
                         r"collective-permute|all-to-all)(-start)?\(")
_ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)\[([0-9,]*)\]")
_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


_CHAIN = re.compile(r'chain_id="(\d+)"')


def collectives(hlo_text: str) -> dict:
    """{kind: {"count", "bytes", "largest_bytes"}} of the collectives in an
    optimized HLO module, as written (an op inside a loop body counts once;
    the pieces a TPU's asynchronous collective fusion splits one op into,
    which share its `chain_id`, count once); an op's bytes are its result's
    per device (an asynchronous `-start` op's tuple holds its operand and
    result: the larger array counts)."""
    out: dict = {}
    chains = set()
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if not m:
            continue
        chain = _CHAIN.search(line)
        if chain:
            if (m.group(2), chain.group(1)) in chains:
                continue
            chains.add((m.group(2), chain.group(1)))
        sizes = [_ITEM_BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d]))
                 for t, dims in _ARRAY.findall(m.group(1))]
        size = max(sizes, default=0) if m.group(3) and m.group(2) != "all-reduce" else sum(sizes)
        entry = out.setdefault(m.group(2), {"count": 0, "bytes": 0, "largest_bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
        entry["largest_bytes"] = max(entry["largest_bytes"], size)
    return out


def compiled_figures(compiled) -> dict:
    """Per device, of a compiled program: bytes (XLA's memory analysis), the
    compiler's FLOPs and bytes accessed, and its collectives."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    return {"arguments": int(memory.argument_size_in_bytes),
            "outputs": int(memory.output_size_in_bytes),
            "temporaries": int(memory.temp_size_in_bytes),
            "code": int(memory.generated_code_size_in_bytes),
            "peak": int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                        + memory.temp_size_in_bytes - memory.alias_size_in_bytes),
            "compiler_flops": float(cost.get("flops", 0.0)),
            "compiler_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "collectives": collectives(compiled.as_text())}


def embed_plan(options: ElmoOptions, mesh, rows: int, length: int = 20) -> dict:
    """`embed` compiled for `rows` sentences of `length` tokens split over every
    device of `mesh` (the biLM replicated): its per-device figures."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from elmo_jax.core.embedding import embed_program  # the jitted program `embed` runs
    from elmo_jax.core.bilm import init_params
    from elmo_jax.core.softmax import ROWS

    replicated = NamedSharding(mesh, P())
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                          jax.eval_shape(lambda: init_params(options, jax.random.PRNGKey(0))))
    ids = jax.ShapeDtypeStruct((rows, length, options.char_cnn.max_characters_per_token),
                               np.int32, sharding=NamedSharding(mesh, P(ROWS)))
    compiled = embed_program.lower(params, ids, options.network()).compile()
    return {"rows": rows, "length": length, **compiled_figures(compiled)}


def _compile_step(options: ElmoOptions, train, vocab_size: int, mesh):
    """The train step `create_train_step` builds, compiled for `mesh`."""
    built = create_train_step(options, train, vocab_size, mesh)
    return built, built.step.lower(built.abstract_state, _abstract_batch(options, mesh)).compile()


def _target_mesh(target: Target, n_model: int):
    devices = compile_only_devices(target)
    per_host = len(devices) // len({d.process_index for d in devices})
    if n_model > per_host:
        raise ConfigError(f"model={n_model} is more than the {per_host} chips of one "
                          f"{target.name} host")
    return make_mesh(n_model, devices)


def plan(config: Config, vocab_size: int, n_data: int, n_model: int,
         utilisation: float = 0.4, target: Target | None = None,
         largest_batch: bool = False) -> dict:
    """Compile (never run) the train step for a data x model mesh; see the module.
    `largest_batch` (with a target) adds `largest_per_device_batch`."""
    n = n_data * n_model
    if target is not None:
        if n != target.chips:
            raise ConfigError(f"the mesh data={n_data},model={n_model} is not the {target.chips} "
                             f"chips of {target.name}")
        mesh = _target_mesh(target, n_model)
    elif largest_batch:
        raise ConfigError("the largest batch is measured against a chip's memory: name a "
                          "--target")
    elif jax.device_count() < n:
        raise ConfigError(f"the mesh needs {n} devices, {jax.device_count()} are here (the plan "
                         "command simulates them on the CPU)")
    else:
        mesh = make_mesh(n_model, jax.devices()[:n])
    options = config.model.replace(n_tokens_vocab=vocab_size)
    train = dataclasses.replace(config.train, mesh_model=n_model)
    built, compiled = _compile_step(options, train, vocab_size, mesh)
    step = compiled_figures(compiled)
    state = built.abstract_state
    tokens = options.batch_size * options.unroll_steps
    full = train.softmax == "full" or options.sample_softmax is False
    flops = train_flops_per_token(options, vocab_size, full) * tokens
    steps = math.ceil(LM1B_TRAIN_TOKENS / tokens)
    dtype = "bfloat16" if train.compute_dtype == "bfloat16" else "float32"
    epoch = {name: round(steps * flops / (n * TARGETS[t].peak(dtype) * 1e12 * utilisation)
                         / 3600, 2) for name, t in PEAK_CHIPS.items()}
    report = {
        "mesh": {"data": n_data, "model": n_model}, "vocab_size": vocab_size,
        "hosts": len({d.process_index for d in mesh.devices.flat}),
        "model_axis_hosts": model_axis_hosts(mesh),
        "softmax": "full" if full else "sampled", "compute_dtype": train.compute_dtype,
        "batch_size": options.batch_size, "unroll_steps": options.unroll_steps,
        "per_device_bytes": {
            "params": _per_device_bytes(state.params),
            "optimizer_state": _per_device_bytes(state.opt_state),
            "lstm_state": _per_device_bytes(state.lstm_state),
            **{f"compiled_{k}": step[k] for k in ("arguments", "outputs", "temporaries",
                                                   "peak")},
        },
        "flops_per_step": flops, "tokens_per_step": tokens, "steps_per_lm1b_epoch": steps,
        "utilisation": utilisation,
        "lm1b_epoch_hours": epoch,
        **(_target_report(target, step, steps, flops, utilisation, options, mesh, dtype)
           if target is not None else {"devices": "simulated on the CPU"}),
    }
    if largest_batch:
        report["largest_per_device_batch"] = largest_per_device_batch(
            options, train, vocab_size, mesh, int(target.hbm_gib * 2 ** 30),
            known={options.batch_size // n: step["peak"]})
    return report


def largest_fitting(fits, start: int, multiple: int = 8, limit: int = 2 ** 16) -> int:
    """The largest multiple of `multiple` up to `limit` for which `fits`
    holds, `fits` being monotone (true up to some size, false beyond): from
    `start`, double (or halve) to bracket the edge, then bisect. 0 if none."""
    start = max(multiple, min(round_up(start, multiple), limit // multiple * multiple))
    if fits(start):  # double to a size that does not fit
        lo = start
        while lo * 2 <= limit and fits(lo * 2):
            lo *= 2
        hi = min(lo * 2, round_up(limit + 1, multiple))
    else:  # halve to one that fits
        hi = start
        while True:
            lo = hi // 2 // multiple * multiple
            if lo < multiple:
                return 0
            if fits(lo):
                break
            hi = lo
    while hi - lo > multiple:
        mid = (lo + hi) // 2 // multiple * multiple
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_per_device_batch(options: ElmoOptions, train, vocab_size: int, mesh, hbm: int,
                             multiple: int = 8, known: dict | None = None,
                             limit: int = 2 ** 16) -> dict:
    """The most rows per device (a multiple of `multiple`) whose compiled
    step's peak fits in `hbm` bytes (`largest_fitting`; each probe one
    compile, and a compiler that refuses a program for memory counts as not
    fitting). `known`: {rows per device: peak bytes} already compiled."""
    peaks = dict(known or {})

    def fits(rows: int) -> bool:
        if rows not in peaks:
            try:
                _, compiled = _compile_step(options.replace(batch_size=rows * mesh.size), train,
                                            vocab_size, mesh)
                peaks[rows] = compiled_figures(compiled)["peak"]
            except jax.errors.JaxRuntimeError as e:
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                peaks[rows] = None  # the compiler ran out of memory
        return peaks[rows] is not None and peaks[rows] <= hbm

    rows = largest_fitting(fits, min(peaks, default=multiple), multiple, limit)
    return {"rows": rows, "peak_bytes": peaks.get(rows), "hbm_bytes": hbm, "multiple": multiple,
            "limit": limit, "compiles": len(peaks) - len(known or {}),
            "probes": {str(r): ("out of memory" if p is None else p)
                       for r, p in sorted(peaks.items())}}


def _target_report(target: Target, step: dict, steps: int, flops: float, utilisation: float,
                   options: ElmoOptions, mesh, dtype: str) -> dict:
    """What a target adds to the plan: the chip, whether the step fits its
    memory, the compiled step's collectives and the compiler's FLOPs, the epoch
    at the chip's peak for the step's matmuls, and the embed program for the
    same chips."""
    hbm = int(target.hbm_gib * 2 ** 30)

    def hours(u: float) -> float:  # 4 significant digits
        seconds = steps * flops / (target.chips * target.peak(dtype) * 1e12 * u)
        return float(f"{seconds / 3600:.4g}")

    return {"devices": f"{target.chips} x {target.chip} ({target.name}, compile-only)",
            "target": {"name": target.name, "chip": target.chip, "chips": target.chips,
                       "chips_per_host": target.chips_per_host, "hbm_bytes": hbm,
                       "peak_tflops_bf16": target.peak_tflops,
                       "peak_tflops": target.peak(dtype)},
            "train_step": step, "fits": step["peak"] <= hbm,
            "lm1b_epoch_hours_on_target": hours(utilisation),
            "lm1b_epoch_hours_at": {"40%": hours(0.4), "60%": hours(0.6)},
            "embed": embed_plan(options, mesh, round_up(options.batch_size, mesh.size))}
