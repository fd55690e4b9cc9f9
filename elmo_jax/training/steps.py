"""The pure steps of pretraining: state, loss, `train_step`, `eval_step`.

bilm-tf's recipe, reproduced: Adagrad (lr 0.2, initial accumulator 1.0),
global-norm clipping at `all_clip_norm_val`, the loss scaled by `unroll_steps`
before the gradient, dropout on each LSTM layer's input and on the top layer's
output, the softmax shared by both directions, trained with the sampled softmax
and evaluated with the full one, and the LSTM state carried from one window to
the next (cut from the gradient at the window boundary).

A batch is `data.StreamBatcher`'s dict (`data/streams.py`'s docstring gives the layout).
"""
from __future__ import annotations

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from elmo_jax.config import SOFTMAX_INITS, TrainConfig
from elmo_jax.core.bilm import BiLM, LSTMState, init_params, init_state
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.softmax import (PAD_BIAS, chunked_softmax_loss, expected_count,
                              log_uniform_prob, log_uniform_sample, pad_softmax,
                              sampled_softmax_from_rows, sharded_full_softmax_loss, sharded_rows,
                              softmax_rows)


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


def init_softmax(options: ElmoOptions, vocab_size: int, rng: jax.Array,
                 how: str = "unigram") -> dict:
    """{"w": [R, P], "b": [R]} for R = softmax_rows(V); rows from V on are padding.

    Rows start N(0, 1/P) as bilm-tf's. Biases: "bilm-tf" starts them at 0;
    "unigram" at the log-probability of each word's rank under the log-uniform
    (Zipf) law the sampler assumes of the frequency-sorted vocabulary, so the
    untrained full softmax is that unigram model. Why: the sampled softmax
    trains only the rows it draws, and with zero biases the rare words' rows,
    not drawn yet, keep random logits that grow with the hidden state and
    dominate the full softmax of a young model (held-out perplexity in the
    millions in one direction at some seeds); under the unigram start a row
    the sampler has not drawn keeps its word's small prior (BENCHMARKS.md,
    "Learning")."""
    P, R = options.lstm.projection_dim, softmax_rows(vocab_size)
    ids = jnp.arange(R)
    if how not in SOFTMAX_INITS:
        raise ValueError(f"softmax_init must be one of {SOFTMAX_INITS}, got {how!r}")
    b = jnp.log(log_uniform_prob(ids, vocab_size)) if how == "unigram" else jnp.zeros((R,))
    return {"w": jax.random.normal(rng, (R, P)) / math.sqrt(P),
            "b": jnp.where(ids < vocab_size, b, PAD_BIAS)}


def init_train_state(options: ElmoOptions, config: TrainConfig, vocab_size: int,
                     bilm_params: dict | None = None,
                     softmax_params: dict | None = None) -> TrainState:
    """A fresh state for `options.batch_size` streams (pretrained parts if given)."""
    rng = jax.random.PRNGKey(config.seed)
    k_bilm, k_softmax, k_run = jax.random.split(rng, 3)
    params = {
        "bilm": bilm_params if bilm_params is not None else init_params(options, k_bilm),
        "softmax": pad_softmax(softmax_params, vocab_size) if softmax_params is not None
        else init_softmax(options, vocab_size, k_softmax, config.softmax_init),
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


def softmax_losses(params, top, targets, rng, options: ElmoOptions, config: TrainConfig,
                   mesh=None, full: bool = False):
    """Per-prediction losses [2, N] of the top layer [2, B, U, P] against the
    targets [2, B, U]: the sampled softmax (one sampler per direction), or the
    exact full one (with `full`, `train.softmax: full` or when the sample would
    cover the vocabulary), computed in vocabulary chunks. With a mesh of
    several devices the softmax rows stay on their shards (of the "model" axis)."""
    hidden = top.reshape(2, -1, options.lstm.projection_dim)
    labels = targets.reshape(2, -1)
    w, b = params["softmax"]["w"], params["softmax"]["b"]
    V = options.n_tokens_vocab or w.shape[0]
    S = options.n_negative_samples_batch
    # on several devices the rows come from each device's own shard of the
    # softmax (shard_map; with model=1 a local gather): left to GSPMD, the
    # gather's gradient, a scatter-add into the replicated matrix, is
    # partitioned with all-to-alls and permutes of the ids
    split = mesh is not None and mesh.size > 1
    if full or config.softmax == "full" or options.sample_softmax is False or S >= V:
        if split:
            return sharded_full_softmax_loss(w, b, hidden, labels, mesh, config.softmax_chunk)
        return jax.vmap(lambda h, y: chunked_softmax_loss(w, b, h, y, config.softmax_chunk))(
            hidden, labels)
    keys = jax.random.split(rng, 2)
    cands = jax.vmap(lambda k: log_uniform_sample(k, S, V))(keys)              # ids [2, S]
    if split:
        true_w, true_b = sharded_rows(w, b, labels, mesh, split_ids=True)
        cand_w, cand_b = sharded_rows(w, b, cands.ids, mesh, split_ids=False)
    else:
        true_w, true_b, cand_w, cand_b = w[labels], b[labels], w[cands.ids], b[cands.ids]

    def one_direction(h, y, tw, tb, c, cw, cb):
        return sampled_softmax_from_rows(h, y, tw, tb, c, cw, cb,
                                         expected_count(y, c.num_tries, S, V),
                                         expected_count(c.ids, c.num_tries, S, V))

    return jax.vmap(one_direction)(hidden, labels, true_w, true_b, cands, cand_w, cand_b)


def loss_fn(params, batch, lstm_state, rng, options: ElmoOptions, config: TrainConfig,
            mesh=None):
    """(total loss, (per-direction losses [2], new LSTM state)); see
    `softmax_losses` for which softmax."""
    top, new_state = top_layer(params, batch, lstm_state, options, config, rng)
    losses = softmax_losses(params, top, batch["targets"], jax.random.fold_in(rng, 2), options,
                            config, mesh)
    per_dir = _direction_means(losses, batch["mask"].reshape(-1))
    return 0.5 * jnp.sum(per_dir), (per_dir, new_state)


def train_step(state: TrainState, batch: dict, *, options: ElmoOptions, config: TrainConfig,
               tx: optax.GradientTransformation, mesh=None):
    """One update -> (new state, metrics {loss, loss_forward, loss_backward,
    grad_norm, tokens})."""
    rng = jax.random.fold_in(state.rng, state.step)
    scale = options.unroll_steps if config.scale_loss_by_unroll_steps else 1.0

    def scaled(params):
        loss, aux = loss_fn(params, batch, state.lstm_state, rng, options, config, mesh)
        return loss * scale, (loss, aux)

    grads, (loss, (per_dir, new_lstm)) = jax.grad(scaled, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                        opt_state=opt_state, lstm_state=jax.lax.stop_gradient(new_lstm))
    metrics = {"loss": loss, "loss_forward": per_dir[0], "loss_backward": per_dir[1],
               "grad_norm": optax.tree.norm(grads), "tokens": jnp.sum(batch["mask"])}
    return new, metrics


def eval_step(params: dict, lstm_state: LSTMState, batch: dict, *, options: ElmoOptions,
              config: TrainConfig, mesh=None):
    """-> (new LSTM state, full-softmax negative log-likelihood summed per
    direction [2], number of predictions [])."""
    top, new_state = top_layer(params, batch, lstm_state, options, config)
    losses = softmax_losses(params, top, batch["targets"], None, options, config, mesh,
                            full=True)
    m = batch["mask"].reshape(-1).astype(jnp.float32)
    return new_state, jnp.sum(losses * m, axis=1), jnp.sum(m)
