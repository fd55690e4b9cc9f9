"""Pretraining the biLM as bilm-tf does, data-parallel over a device mesh.

`train_step(state, batch)` is one pure function under `jax.jit`, with the
batch sharded over the mesh's `data` axis and the parameters replicated (the
softmax matrix may be split over a `model` axis). The same code runs on one
CPU, 8 simulated CPU devices, a GPU or a TPU slice; several hosts start it
through `jax.distributed.initialize()`.

bilm-tf's recipe, reproduced: Adagrad (lr 0.2, initial accumulator 1.0),
global-norm clipping at `all_clip_norm_val`, the loss scaled by `unroll_steps`
before the gradient, dropout on each LSTM layer's input and on the top layer's
output, the softmax shared by both directions, trained with the sampled softmax
and evaluated with the full one, and the LSTM state carried from one window to
the next (cut from the gradient at the window boundary).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import sys
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax import data as data_lib
from elmo_jax.model import BiLM, LSTMState, init_params, init_state
from elmo_jax.options import ElmoOptions
from elmo_jax.softmax import full_softmax_loss, sampled_softmax
from elmo_jax.vocab import Vocabulary
from elmo_jax.weights import load_weights, save_weights


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


# ----------------------------------------------------------------------------
# configuration


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything about a run that is not the model (the "train" part of a config)."""
    learning_rate: float = 0.2
    initial_accumulator_value: float = 1.0
    scale_loss_by_unroll_steps: bool = True   # bilm-tf: compute_gradients(loss * unroll_steps)
    seed: int = 0
    max_steps: int | None = None              # default: n_epochs over n_train_tokens
    max_seconds: float | None = None          # stop (and checkpoint) after this wall time
    log_every: int = 20
    eval_every: int = 0                       # 0: evaluate at the end only
    checkpoint_every: int = 500
    max_to_keep: int = 3
    eval_batch_size: int = 32
    eval_unroll_steps: int = 20
    mesh_model: int = 1                       # devices on the `model` axis (softmax split)
    scan_unroll: int = 1
    compute_dtype: str = "float32"            # "bfloat16": bf16 matmuls, f32 state

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)


def load_config(path: str) -> tuple[ElmoOptions, TrainConfig]:
    """A config file: {"options": bilm-tf options.json, "train": TrainConfig fields}."""
    with open(path, encoding="utf-8") as fh:
        d = json.load(fh)
    unknown = set(d) - {"options", "train", "description"}
    if unknown or "options" not in d:
        raise ValueError(f"{path}: a config has 'options' and 'train' (found {sorted(d)})")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = sorted(set(d.get("train", {})) - names)
    if bad:
        raise ValueError(f"{path}: unknown train field '{bad[0]}'")
    return ElmoOptions.from_dict(d["options"]), TrainConfig(**d.get("train", {}))


# ----------------------------------------------------------------------------
# state and steps


@flax.struct.dataclass
class TrainState:
    step: jax.Array          # [] int32
    params: dict             # {"bilm": biLM params, "softmax": {"w": [V, P], "b": [V]}}
    opt_state: Any
    lstm_state: LSTMState    # [L, 2, B, .] carried between windows
    rng: jax.Array           # base key; step k uses fold_in(rng, k)


def make_optimizer(options: ElmoOptions, config: TrainConfig) -> optax.GradientTransformation:
    # TF's Adagrad: accum += g**2; w -= lr * g / sqrt(accum)  (no epsilon).
    return optax.chain(optax.clip_by_global_norm(options.all_clip_norm_val),
                       optax.adagrad(config.learning_rate, config.initial_accumulator_value,
                                     eps=0.0))


def init_softmax(options: ElmoOptions, vocab_size: int, rng: jax.Array) -> dict:
    P = options.lstm.projection_dim
    return {"w": jax.random.normal(rng, (vocab_size, P)) / math.sqrt(P),
            "b": jnp.zeros((vocab_size,))}


def init_train_state(options: ElmoOptions, config: TrainConfig, vocab_size: int,
                     batch_size: int, bilm_params: dict | None = None,
                     softmax_params: dict | None = None) -> TrainState:
    rng = jax.random.PRNGKey(config.seed)
    k_bilm, k_softmax, k_run = jax.random.split(rng, 3)
    params = {
        "bilm": bilm_params if bilm_params is not None else init_params(options, k_bilm),
        "softmax": softmax_params if softmax_params is not None
        else init_softmax(options, vocab_size, k_softmax),
    }
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=make_optimizer(options, config).init(params),
                      lstm_state=init_state(options, batch_size), rng=k_run)


def _dropout(rng, x, rate):
    if rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def _token_vectors(model, v, token_chars, token_index):
    """Encode each group's distinct tokens once, then place them:
    token_chars [S, N, C], token_index [2, B, U] -> [2, B, U, P]."""
    table = model.apply(v, token_chars, method=BiLM.tokens)            # [S, N, P]
    S, B, U = token_chars.shape[0], token_index.shape[1], token_index.shape[2]
    index = token_index.reshape(2, S, B // S, U)
    x = jax.vmap(lambda t, i: t[i], in_axes=(0, 1), out_axes=1)(table, index)
    return x.reshape(2, B, U, table.shape[-1])


def _forward(params, batch, lstm_state, options, config, rng=None):
    """Both directions over one window -> (top layer [2, B, U, P], new LSTMState).
    Dropout is on when `rng` is given."""
    model = BiLM(options, unroll=config.scan_unroll, dtype=config.dtype)
    v = {"params": params["bilm"]}
    train = rng is not None
    x = _token_vectors(model, v, batch["token_chars"], batch["token_index"])
    x = x * batch["mask"][None, :, :, None]
    rngs = {"dropout": jax.random.fold_in(rng, 0)} if train else {}
    outs, new_state = model.apply(v, x, batch["mask"], lstm_state, not train,
                                  method=BiLM.lstms, rngs=rngs)
    top = outs[-1]
    if train:
        top = _dropout(jax.random.fold_in(rng, 1), top, options.dropout)
    return top, new_state


def _direction_means(losses, mask):
    """losses [2, N], mask [N] -> mean loss of each direction [2]."""
    m = mask.astype(jnp.float32)
    return jnp.sum(losses * m, axis=1) / jnp.maximum(jnp.sum(m), 1.0)


def loss_fn(params, batch, lstm_state, rng, options: ElmoOptions, config: TrainConfig):
    """(total loss, (per-direction losses [2], new LSTM state)); sampled softmax
    when it samples fewer classes than the vocabulary holds, else the full one."""
    top, new_state = _forward(params, batch, lstm_state, options, config, rng)
    P = options.lstm.projection_dim
    hidden = top.reshape(2, -1, P)
    labels = batch["targets"].reshape(2, -1)
    w, b = params["softmax"]["w"], params["softmax"]["b"]
    S = options.n_negative_samples_batch
    if S < w.shape[0]:
        keys = jax.random.split(jax.random.fold_in(rng, 2), 2)  # one sampler per direction
        losses = jax.vmap(lambda k, h, y: sampled_softmax(k, w, b, h, y, S))(keys, hidden, labels)
    else:
        losses = jax.vmap(lambda h, y: full_softmax_loss(w, b, h, y))(hidden, labels)
    per_dir = _direction_means(losses, batch["mask"].reshape(-1))
    return 0.5 * jnp.sum(per_dir), (per_dir, new_state)


def train_step(state: TrainState, batch: dict, *, options: ElmoOptions, config: TrainConfig,
               tx: optax.GradientTransformation):
    """One update on a batch from `data.Batcher` (see there for the shapes)."""
    rng = jax.random.fold_in(state.rng, state.step)
    scale = options.unroll_steps if config.scale_loss_by_unroll_steps else 1.0

    def scaled(params):
        loss, aux = loss_fn(params, batch, state.lstm_state, rng, options, config)
        return loss * scale, (loss, aux)

    grads, (loss, (per_dir, new_lstm)) = jax.grad(scaled, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                        opt_state=opt_state, lstm_state=jax.lax.stop_gradient(new_lstm))
    metrics = {"loss": loss, "loss_forward": per_dir[0], "loss_backward": per_dir[1],
               "grad_norm": optax.tree.norm(grads), "tokens": jnp.sum(batch["mask"])}
    return new, metrics


def eval_step(params: dict, lstm_state: LSTMState, batch: dict, *, options: ElmoOptions,
              config: TrainConfig):
    """Full-softmax negative log-likelihood summed per direction [2] and the
    number of predictions, with the LSTM state carried."""
    top, new_state = _forward(params, batch, lstm_state, options, config)
    w, b = params["softmax"]["w"], params["softmax"]["b"]
    hidden = top.reshape(2, -1, options.lstm.projection_dim)
    losses = jax.vmap(lambda h, y: full_softmax_loss(w, b, h, y))(
        hidden, batch["targets"].reshape(2, -1))
    m = batch["mask"].reshape(-1).astype(jnp.float32)
    return new_state, jnp.sum(losses * m, axis=1), jnp.sum(m)


_eval_step_jit = jax.jit(eval_step, static_argnames=("options", "config"))


def evaluate(params: dict, options: ElmoOptions, config: TrainConfig, vocab: Vocabulary,
             eval_files: str) -> dict:
    """Perplexity over held-out files, read once in order by `eval_batch_size`
    streams with the state carried: forward, backward, and bilm-tf's number,
    exp of the mean of the two directions' mean losses."""
    batcher = data_lib.Batcher(data_lib.OnceSource(eval_files), vocab, config.eval_batch_size,
                               config.eval_unroll_steps,
                               options.char_cnn.max_characters_per_token)
    step = functools.partial(_eval_step_jit, options=options, config=config)
    state = init_state(options, config.eval_batch_size)
    total, count = np.zeros(2), 0.0
    for batch in batcher:
        state, nll, n = step(params, state, batch)
        total += np.asarray(nll, np.float64)
        count += float(n)
    if count == 0:
        raise data_lib.DataError(f"no held-out sentences in {eval_files!r}")
    mean = total / count
    return {"eval_ppl_forward": float(np.exp(mean[0])), "eval_ppl_backward": float(np.exp(mean[1])),
            "eval_ppl": float(np.exp(mean.mean())), "eval_tokens": int(count)}


# ----------------------------------------------------------------------------
# mesh and shardings


def make_mesh(config: TrainConfig, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    if len(devices) % config.mesh_model:
        raise ValueError(f"mesh_model={config.mesh_model} does not divide the "
                         f"{len(devices)} devices")
    grid = np.array(devices).reshape(len(devices) // config.mesh_model, config.mesh_model)
    return Mesh(grid, ("data", "model"))


def state_shardings(abstract_state: TrainState, mesh: Mesh) -> TrainState:
    """Replicated parameters, LSTM state split by batch row, softmax rows split
    over `model` (optimizer slots follow their parameters)."""
    def spec(path, leaf):
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        if "lstm_state" in keys:
            return NamedSharding(mesh, P(None, None, "data"))
        if "softmax" in keys and getattr(leaf, "ndim", 0) >= 1:
            return NamedSharding(mesh, P("model"))
        return NamedSharding(mesh, P())
    return jax.tree_util.tree_map_with_path(spec, abstract_state)


def batch_shardings(mesh: Mesh) -> dict:
    return {"token_chars": NamedSharding(mesh, P("data")),
            "token_index": NamedSharding(mesh, P(None, "data")),
            "targets": NamedSharding(mesh, P(None, "data")),
            "mask": NamedSharding(mesh, P("data"))}


def global_batch(local: dict, shardings: dict) -> dict:
    """Host-local numpy batch -> global arrays (each process holds its rows)."""
    if jax.process_count() > 1:  # the token tables must have one shape everywhere
        n = multihost_utils.process_allgather(np.array([local["token_chars"].shape[1]]))
        local = data_lib.pad_tables(local, int(np.max(n)))
    return {k: jax.make_array_from_process_local_data(shardings[k], v) for k, v in local.items()}


# ----------------------------------------------------------------------------
# checkpoints


def _checkpoint_manager(workdir: str, config: TrainConfig) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.max_to_keep, create=True))


def _gather_json(obj) -> list:
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
    positions = _gather_json(data_position)
    mngr.save(int(state.step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"process_count": len(positions), "positions": positions})),
        force=True)
    mngr.wait_until_finished()


def restore_checkpoint(mngr, step: int, abstract_state: TrainState) -> tuple[TrainState, dict]:
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
    if positions["process_count"] != jax.process_count():
        raise TrainingError(f"the checkpoint at {where} was written by "
                            f"{positions['process_count']} processes; this run has "
                            f"{jax.process_count()}")
    return out["state"], positions["positions"][jax.process_index()]


def _abstract_state(options, config, vocab_size, batch_size, mesh):
    abstract = jax.eval_shape(lambda: init_train_state(options, config, vocab_size, batch_size))
    shardings = state_shardings(abstract, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract, shardings)
    return abstract, shardings


# ----------------------------------------------------------------------------
# workdir records


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def _run_vocab(workdir: str) -> Vocabulary:
    return Vocabulary.from_file(os.path.join(workdir, "vocab.txt"))


def read_run_record(workdir: str) -> dict:
    path = os.path.join(workdir, "run.json")
    if not os.path.exists(path):
        raise TrainingError(f"{workdir} holds no training run (no run.json)")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


class MetricsLog:
    """DIR/metrics.jsonl: one JSON record per log or evaluation event."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, record: dict) -> None:
        if jax.process_index() == 0:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------
# the pretrained starting point (fine-tuning)


def load_pretrained(init_from: str, vocab: Vocabulary):
    """--init_from: a weights hdf5 (with options.json beside it) or a training
    workdir. Returns (options, bilm params, softmax params or None); the softmax
    is kept only when the vocabulary is the same."""
    if os.path.isdir(init_from):
        options, _, state = _restore_latest(init_from)
        softmax = state.params["softmax"] if _run_vocab(init_from).words == vocab.words else None
        return options, state.params["bilm"], softmax
    options_path = os.path.join(os.path.dirname(os.path.abspath(init_from)), "options.json")
    if not os.path.exists(options_path):
        raise TrainingError(f"--init_from {init_from}: expected options.json beside the weights")
    options = ElmoOptions.from_json(options_path)
    return options, load_weights(init_from, options), None


# ----------------------------------------------------------------------------
# the loop


def train(options: ElmoOptions, config: TrainConfig, train_files: str, vocab_file: str,
          workdir: str, eval_files: str | None = None, init_from: str | None = None,
          progress: bool = True, source=None) -> dict:
    """Train (or resume) in `workdir`; returns the last metrics record.

    Resumes exactly from the latest checkpoint in `workdir` when there is one.
    Stops after `config.max_steps` steps or `config.max_seconds`, on SIGTERM or
    Ctrl-C (after saving a checkpoint), or on a non-finite loss (keeping the last
    good checkpoint)."""
    from tqdm import tqdm

    vocab = Vocabulary.from_file(vocab_file)
    os.makedirs(workdir, exist_ok=True)
    mngr = _checkpoint_manager(workdir, config)
    resume_step = mngr.latest_step()
    bilm_params = softmax_params = None
    if resume_step is not None:
        record = read_run_record(workdir)
        saved = ElmoOptions.from_dict(record["options"])
        if saved.lstm != options.lstm or saved.char_cnn != options.char_cnn:
            raise TrainingError(f"{workdir} holds a run of another model; use a new --workdir")
        if _run_vocab(workdir).words != vocab.words:
            raise TrainingError(f"{workdir} was trained with another vocabulary than {vocab_file}")
        options = saved
    elif init_from:
        pre, bilm_params, softmax_params = load_pretrained(init_from, vocab)
        pre_cnn = dataclasses.replace(pre.char_cnn, n_characters=options.char_cnn.n_characters)
        if (pre.lstm, pre_cnn) != (options.lstm, options.char_cnn):
            print(f"--init_from: using the pretrained model's architecture from {init_from}")
        options = options.replace(lstm=pre.lstm, char_cnn=pre_cnn)
    options = options.replace(n_tokens_vocab=len(vocab))

    mesh = make_mesh(config)
    n_data = mesh.shape["data"]
    if options.batch_size % n_data or n_data % jax.process_count():
        raise ValueError(f"batch_size {options.batch_size} must divide evenly over the "
                         f"{n_data} data-parallel devices and {jax.process_count()} processes")
    if len(vocab) % config.mesh_model:
        raise ValueError(f"vocabulary size {len(vocab)} must divide over mesh_model="
                         f"{config.mesh_model}")
    local_batch = options.batch_size // jax.process_count()
    if source is None:
        source = data_lib.TextSource(train_files, seed=config.seed,
                                     process_index=jax.process_index(),
                                     process_count=jax.process_count())
    # one token table per data shard held by this process
    local_groups = n_data // jax.process_count()
    batcher = data_lib.Batcher(source, vocab, local_batch, options.unroll_steps,
                               options.char_cnn.max_characters_per_token, n_groups=local_groups)
    abstract, shardings = _abstract_state(options, config, len(vocab), options.batch_size, mesh)
    if resume_step is not None:
        state, position = restore_checkpoint(mngr, resume_step, abstract)
        batcher.restore(position)
    else:
        state = jax.jit(lambda bp, sp: init_train_state(options, config, len(vocab),
                                                        options.batch_size, bp, sp),
                        out_shardings=shardings)(bilm_params, softmax_params)
        if jax.process_index() == 0:
            vocab.to_file(os.path.join(workdir, "vocab.txt"))
            _write_json(os.path.join(workdir, "run.json"), {
                "options": options.to_dict(), "train": dataclasses.asdict(config),
                "train_files": train_files, "vocab_file": os.path.abspath(vocab_file),
                "vocab_size": len(vocab), "init_from": init_from})

    tx = make_optimizer(options, config)
    step_fn = jax.jit(
        lambda s, b: train_step(s, b, options=options, config=config, tx=tx),
        in_shardings=(shardings, batch_shardings(mesh)), out_shardings=(shardings, None),
        donate_argnums=0)
    max_steps = config.max_steps
    if max_steps is None and config.max_seconds is not None:
        max_steps = math.inf  # the time limit ends the run
    elif max_steps is None:
        if not options.n_train_tokens:
            raise ValueError("give max_steps, max_seconds, or n_train_tokens and n_epochs in "
                             "the options")
        per_step = options.batch_size * options.unroll_steps
        max_steps = options.n_epochs * (options.n_train_tokens // per_step)

    stop = {"signal": None}
    handlers = {}

    def request_stop(signum, frame):
        stop["signal"] = signum
        signal.signal(signum, handlers[signum])  # a second signal acts as usual

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            handlers[sig] = signal.signal(sig, request_stop)
        except ValueError:  # not the main thread
            pass

    log = MetricsLog(workdir)
    step = int(state.step)
    last = {"step": step}
    t_start = time.time()
    window_t, window_tokens, window_loss, window_n = time.time(), 0, 0.0, 0
    bar = tqdm(total=None if max_steps == math.inf else max_steps, initial=step, unit="step",
               disable=not progress or jax.process_index() != 0, dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 30.0)
    last_saved = resume_step
    try:
        shardings_b = batch_shardings(mesh)
        batch = global_batch(next(batcher), shardings_b)
        position = batcher.position()  # of the data after `batch`
        while step < max_steps:
            state, metrics = step_fn(state, batch)
            # the next batch is made on the host while the device computes this step
            state_position = position
            if step + 1 < max_steps:
                batch = global_batch(next(batcher), shardings_b)
                position = batcher.position()
            loss = float(metrics["loss"])
            step += 1
            if not math.isfinite(loss):
                log.write({"step": step, "event": "diverged", "train_loss": loss})
                kept = f"the last good checkpoint (step {last_saved}) is kept" if last_saved \
                    else "no checkpoint had been written"
                raise TrainingError(f"the loss became {loss} at step {step}: training stopped "
                                    f"and {kept}. Lower the learning rate or check the data.")
            window_tokens += int(metrics["tokens"])
            window_loss += loss
            window_n += 1
            bar.update(1)
            if step % config.log_every == 0 or step == max_steps:
                now = time.time()
                last = {"step": step, "train_loss": window_loss / window_n,
                        "train_ppl": math.exp(min(window_loss / window_n, 50.0)),
                        "loss_forward": float(metrics["loss_forward"]),
                        "loss_backward": float(metrics["loss_backward"]),
                        "grad_norm": float(metrics["grad_norm"]),
                        "tokens_per_sec": window_tokens / max(now - window_t, 1e-9),
                        "elapsed_sec": now - t_start}
                log.write(last)
                bar.set_postfix(loss=f"{last['train_loss']:.3f}",
                                tok_s=f"{last['tokens_per_sec']:.0f}")
                window_t, window_tokens, window_loss, window_n = now, 0, 0.0, 0
            timed_out = config.max_seconds is not None and time.time() - t_start > config.max_seconds
            if step % config.checkpoint_every == 0 or stop["signal"] or timed_out:
                save_checkpoint(mngr, state, state_position)
                last_saved = step
            if eval_files and config.eval_every and step % config.eval_every == 0:
                last = {"step": step, **evaluate(state.params, options, config, vocab, eval_files)}
                log.write(last)
            if stop["signal"] or timed_out:
                why = "time limit" if timed_out else signal.Signals(stop["signal"]).name
                tqdm.write(f"stopped at step {step} ({why}); checkpoint saved. Run the same "
                           "command again to resume.", file=sys.stderr)
                break
        if step == max_steps and last_saved != step:
            save_checkpoint(mngr, state, state_position)
        if eval_files and not (config.eval_every and step % config.eval_every == 0):
            last = {"step": step, **evaluate(state.params, options, config, vocab, eval_files)}
            log.write(last)
    finally:
        bar.close()
        for sig, h in handlers.items():
            signal.signal(sig, h)
        mngr.wait_until_finished()
    return last


# ----------------------------------------------------------------------------
# export


def _restore_latest(workdir: str):
    """(options, config, state) of the newest checkpoint, on one device."""
    record = read_run_record(workdir)
    options = ElmoOptions.from_dict(record["options"])
    config = TrainConfig(**record["train"])
    mngr = _checkpoint_manager(workdir, config)
    step = mngr.latest_step()
    if step is None:
        raise TrainingError(f"{workdir} has no checkpoint yet")
    mesh = make_mesh(config, jax.devices()[:1])
    abstract, _ = _abstract_state(options, config, record["vocab_size"], options.batch_size, mesh)
    state, _ = restore_checkpoint(mngr, step, abstract)
    return options, config, state


def evaluate_workdir(workdir: str, eval_files: str) -> dict:
    """Held-out perplexity of the newest checkpoint in `workdir`."""
    options, config, state = _restore_latest(workdir)
    return {"step": int(state.step),
            **evaluate(state.params, options, config, _run_vocab(workdir), eval_files)}


def export(workdir: str, out_dir: str) -> dict:
    """Write `options.json` + `weights.hdf5` (+ `vocab.txt`) of the latest
    checkpoint: the bilm-tf / AllenNLP format, loadable by `load_weights`."""
    options, _, state = _restore_latest(workdir)
    os.makedirs(out_dir, exist_ok=True)
    # Inference files describe the 262-row table (the padding row prepended).
    inference = options.replace(char_cnn=dataclasses.replace(options.char_cnn, n_characters=262))
    save_weights(os.path.join(out_dir, "weights.hdf5"), state.params["bilm"], inference)
    inference.to_json(os.path.join(out_dir, "options.json"))
    _run_vocab(workdir).to_file(os.path.join(out_dir, "vocab.txt"))
    return {"step": int(state.step), "out_dir": out_dir}
