"""The pure steps of pretraining: state, loss, `train_step`, `eval_step`.

bilm-tf's recipe, reproduced: Adagrad (lr 0.2, initial accumulator 1.0),
global-norm clipping at `all_clip_norm_val`, the loss scaled by `unroll_steps`
before the gradient, dropout on each LSTM layer's input and on the top layer's
output, the softmax shared by both directions, trained with the sampled softmax
and evaluated with the full one, and the LSTM state carried from one window to
the next (cut from the gradient at the window boundary).

A batch is `data.Batcher`'s dict (its docstring gives the layout).
"""
from __future__ import annotations

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from elmo_jax.config import TrainConfig
from elmo_jax.model import BiLM, LSTMState, init_params, init_state
from elmo_jax.options import ElmoOptions
from elmo_jax.softmax import full_softmax_loss, sampled_softmax


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
                     bilm_params: dict | None = None,
                     softmax_params: dict | None = None) -> TrainState:
    """A fresh state for `options.batch_size` streams (pretrained parts if given)."""
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
                      lstm_state=init_state(options, options.batch_size), rng=k_run)


def _dropout(rng, x, rate):
    if rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def readings(model: BiLM, variables: dict, batch: dict) -> jax.Array:
    """The two readings' token vectors [2, B, U, P] of a batch: each group's
    distinct tokens (token_chars [S, N, C]) are encoded once, then placed by
    token_index [2, B, U]."""
    token_chars, token_index = batch["token_chars"], batch["token_index"]
    table = model.apply(variables, token_chars, method=BiLM.encode_tokens)   # [S, N, P]
    S, B, U = token_chars.shape[0], token_index.shape[1], token_index.shape[2]
    index = token_index.reshape(2, S, B // S, U)
    x = jax.vmap(lambda t, i: t[i], in_axes=(0, 1), out_axes=1)(table, index)
    return x.reshape(2, B, U, table.shape[-1])


def top_layer(params, batch, lstm_state, options, config, rng=None):
    """Both directions over one window -> (top layer [2, B, U, P], new LSTMState).
    Dropout is on when `rng` is given."""
    model = BiLM(options, unroll=config.scan_unroll, dtype=config.dtype)
    v = {"params": params["bilm"]}
    train = rng is not None
    rngs = {"dropout": jax.random.fold_in(rng, 0)} if train else {}
    outs, new_state = model.apply(v, readings(model, v, batch), batch["mask"], lstm_state,
                                  not train, rngs=rngs)
    top = outs[-1]
    if train:
        top = _dropout(jax.random.fold_in(rng, 1), top, options.dropout)
    return top, new_state


def _direction_means(losses, mask):
    """losses [2, N], mask [N] -> mean loss of each direction [2]."""
    m = mask.astype(jnp.float32)
    return jnp.sum(losses * m, axis=1) / jnp.maximum(jnp.sum(m), 1.0)


def loss_fn(params, batch, lstm_state, rng, options: ElmoOptions, config: TrainConfig):
    """(total loss, (per-direction losses [2], new LSTM state)); the sampled
    softmax when it samples fewer classes than the vocabulary holds, else (or
    with bilm-tf's `sample_softmax: false`) the full one."""
    top, new_state = top_layer(params, batch, lstm_state, options, config, rng)
    hidden = top.reshape(2, -1, options.lstm.projection_dim)
    labels = batch["targets"].reshape(2, -1)
    w, b = params["softmax"]["w"], params["softmax"]["b"]
    S = options.n_negative_samples_batch
    if options.sample_softmax is not False and S < w.shape[0]:
        keys = jax.random.split(jax.random.fold_in(rng, 2), 2)  # one sampler per direction
        losses = jax.vmap(lambda k, h, y: sampled_softmax(k, w, b, h, y, S))(keys, hidden, labels)
    else:
        losses = jax.vmap(lambda h, y: full_softmax_loss(w, b, h, y))(hidden, labels)
    per_dir = _direction_means(losses, batch["mask"].reshape(-1))
    return 0.5 * jnp.sum(per_dir), (per_dir, new_state)


def train_step(state: TrainState, batch: dict, *, options: ElmoOptions, config: TrainConfig,
               tx: optax.GradientTransformation):
    """One update -> (new state, metrics {loss, loss_forward, loss_backward,
    grad_norm, tokens})."""
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
    """-> (new LSTM state, full-softmax negative log-likelihood summed per
    direction [2], number of predictions [])."""
    top, new_state = top_layer(params, batch, lstm_state, options, config)
    w, b = params["softmax"]["w"], params["softmax"]["b"]
    hidden = top.reshape(2, -1, options.lstm.projection_dim)
    losses = jax.vmap(lambda h, y: full_softmax_loss(w, b, h, y))(
        hidden, batch["targets"].reshape(2, -1))
    m = batch["mask"].reshape(-1).astype(jnp.float32)
    return new_state, jnp.sum(losses * m, axis=1), jnp.sum(m)
