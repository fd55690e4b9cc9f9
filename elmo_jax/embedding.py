"""`embed`: character ids -> the ELMo layer stack, plus the learned scalar mix.

`embed` is a pure function of (params, char_ids[, state][, mix]); the options
are static. It is jitted with `options` and `mix_layer_norm` static, and works
under `jax.grad`, `jax.vmap` and a sharded `jax.jit` (no Python control flow
on data). `Elmo` is a thin, stateful convenience wrapper for notebooks.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.model import (BiLM, LSTMState, add_sentence_boundaries, init_state,
                            reverse_padded, token_mask)
from elmo_jax.options import ElmoOptions
from elmo_jax.weights import load_weights


class EmbedOutput(NamedTuple):
    """What `embed` returns (a pytree).

    layers:      [L+1, B, T, 2P] layer 0 = token vectors duplicated, then one per
                 LSTM layer (forward half, backward half); zero at padded tokens.
    mask:        [B, T] bool, True at real tokens.
    state:       LSTMState after the last real position of each row.
    mixed:       one [B, T, 2P] array per scalar mix, or None without `mix`.
    mix_weights: [n_mixes, L+1] softmax-normalised mix weights, or None."""
    layers: jax.Array
    mask: jax.Array
    state: LSTMState
    mixed: tuple | None = None
    mix_weights: jax.Array | None = None


def init_mix(options: ElmoOptions, n_mixes: int = 1) -> dict:
    """Scalar-mix parameters for `n_mixes` mixes: weights [n_mixes, L+1] = 0
    (so softmax gives equal weights) and gamma [n_mixes] = 1."""
    if n_mixes < 1:
        raise ValueError(f"n_mixes must be >= 1, got {n_mixes}")
    return {"weights": jnp.zeros((n_mixes, options.n_output_layers), jnp.float32),
            "gamma": jnp.ones((n_mixes,), jnp.float32)}


def _layer_norm(x: jax.Array, mask: jax.Array) -> jax.Array:
    """AllenNLP's ScalarMix layer norm: one mean and variance over all unmasked
    elements of the layer x [B, T, W] (mask [B, T])."""
    m = mask[..., None].astype(x.dtype)
    n = jnp.maximum(jnp.sum(m) * x.shape[-1], 1.0)
    mean = jnp.sum(x * m) / n
    var = jnp.sum(((x * m - mean) * m) ** 2) / n
    return (x - mean) / jnp.sqrt(var + 1e-13)


def scalar_mix(layers: jax.Array, mask: jax.Array, mix: dict, layer_norm: bool = False):
    """gamma * sum_k softmax(w)_k * layer_k for each mix.

    layers [K, B, T, W], mask [B, T] -> (tuple of [B, T, W], weights [n_mixes, K])."""
    weights = jax.nn.softmax(mix["weights"], axis=-1)
    if layer_norm:
        layers = jax.vmap(_layer_norm, in_axes=(0, None))(layers, mask)
    mixed = jnp.einsum("nk,kbtw->nbtw", weights, layers) * mix["gamma"][:, None, None, None]
    return tuple(mixed), weights


@functools.partial(jax.jit, static_argnames=("options", "mix_layer_norm", "unroll", "dtype"))
def embed(params: dict, char_ids: jax.Array, options: ElmoOptions,
          state: LSTMState | None = None, mix: dict | None = None, *,
          mix_layer_norm: bool = False, unroll: int = 1, dtype=jnp.float32) -> EmbedOutput:
    """ELMo representations of a batch.

    params:   biLM parameters (`load_weights`, `init_params` or training).
    char_ids: [B, T, C] int32 from `batch_to_char_ids` (real tokens first in
              each row, then all-zero padding tokens).
    state:    LSTMState for B rows to continue from (stateful use), or None to
              start from zeros (the default: a sentence always gets the same vectors).
    mix:      scalar-mix parameters from `init_mix`; adds `mixed` and `mix_weights`.
              The mix is taken over positions including `<S>`/`</S>`, as AllenNLP
              does, so its optional layer norm sees the same elements.
    unroll, dtype: speed knobs: `lax.scan` unroll and the matmul input dtype
              (bf16 on accelerators; cell state and gates stay float32)."""
    if char_ids.ndim != 3:
        raise ValueError(f"char_ids must be [batch, tokens, chars], got shape {char_ids.shape}")
    B, T, C = char_ids.shape
    if B == 0:
        raise ValueError("embed got an empty batch (0 rows)")
    if C != options.char_cnn.max_characters_per_token:
        raise ValueError(f"char_ids have {C} characters per token; the options say "
                         f"{options.char_cnn.max_characters_per_token}")
    if not jnp.issubdtype(char_ids.dtype, jnp.integer):
        raise TypeError(f"char_ids must be integers, got {char_ids.dtype}")
    if state is None:
        state = init_state(options, B)
    elif state.h.shape[2] != B:
        raise ValueError(f"state has {state.h.shape[2]} rows but the batch has {B}; "
                         "slice or pad the state to the batch")
    model = BiLM(options, unroll=unroll, dtype=dtype)
    variables = {"params": params}

    mask = token_mask(char_ids)                                   # [B, T]
    lengths = jnp.sum(mask, axis=1)
    ids = add_sentence_boundaries(char_ids.astype(jnp.int32), lengths)  # [B, T+2, C]
    full_lengths = lengths + 2
    full_mask = jnp.arange(T + 2)[None, :] < full_lengths[:, None]

    x = model.apply(variables, ids, method=BiLM.tokens) * full_mask[..., None]
    x2 = jnp.stack([x, reverse_padded(x, full_lengths)])         # [2, B, T+2, P]
    outs, new_state = model.apply(variables, x2, full_mask, state, method=BiLM.lstms)
    fwd = outs[:, 0]
    bwd = jax.vmap(reverse_padded, in_axes=(0, None))(outs[:, 1], full_lengths)
    full = jnp.concatenate([jnp.concatenate([x, x], -1)[None],
                            jnp.concatenate([fwd, bwd], -1)], axis=0)  # [L+1, B, T+2, 2P]

    def strip(a):  # drop <S> and </S>; zero padded tokens
        return a[..., 1:T + 1, :] * mask[..., None]

    out = EmbedOutput(layers=strip(full), mask=mask, state=new_state)
    if mix is not None:
        mixed, weights = scalar_mix(full, full_mask, mix, mix_layer_norm)
        out = out._replace(mixed=tuple(strip(m) for m in mixed), mix_weights=weights)
    return out


def _bucket(n: int, smallest: int) -> int:
    """The next power of two >= n (at least `smallest`): few distinct shapes,
    so few compilations."""
    b = smallest
    while b < n:
        b *= 2
    return b


class Elmo:
    """Embed token lists from a notebook: `Elmo.from_files(o, w).embed_sentences(s)`.

    Batches are sorted by length and padded to power-of-two lengths and batch
    sizes, so that new inputs rarely trigger a compilation. With
    `stateful=True` the LSTM state of each batch row is carried from one call to
    the next (bilm-tf's behaviour; sentences are then not reordered)."""

    def __init__(self, params: dict, options: ElmoOptions, stateful: bool = False,
                 min_length_bucket: int = 8):
        self.params = jax.device_put(params)
        self.options = options
        self.stateful = stateful
        self.min_length_bucket = min_length_bucket
        self.state: LSTMState | None = None

    @classmethod
    def from_files(cls, options_json: str | os.PathLike, weights_hdf5: str | os.PathLike,
                   **kwargs) -> "Elmo":
        options = ElmoOptions.from_json(options_json)
        return cls(load_weights(weights_hdf5, options), options, **kwargs)

    def reset_state(self) -> None:
        self.state = None

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 64
                        ) -> list[np.ndarray]:
        """One float32 array [L+1, n_tokens, 2P] per sentence, in input order."""
        if len(sentences) == 0:
            return []
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        order = list(range(len(sentences)))
        if not self.stateful:
            order.sort(key=lambda i: len(sentences[i]))
        result: list[np.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = [sentences[i] for i in idx]
            layers = self._embed_batch(batch)
            for row, i in enumerate(idx):
                result[i] = layers[:, row, :len(sentences[i])]
        return result

    def _embed_batch(self, batch) -> np.ndarray:
        C = self.options.char_cnn.max_characters_per_token
        T = _bucket(max(len(s) for s in batch), self.min_length_bucket)
        if self.stateful:
            rows = len(batch)
            state = self._stateful_rows(rows)
        else:
            rows = _bucket(len(batch), 1)
            batch = list(batch) + [[]] * (rows - len(batch))
            state = None
        ids = chars.batch_to_char_ids(batch, max_chars=C, min_length=T)
        out = embed(self.params, ids, self.options, state)
        if self.stateful:
            self.state = jax.tree.map(lambda full, new: full.at[:, :, :rows].set(new),
                                      self.state, out.state)
        return np.asarray(out.layers)

    def _stateful_rows(self, rows: int) -> LSTMState:
        """The carried state of the first `rows` rows, growing the store with
        zero rows when a batch is larger than any before it."""
        if self.state is None or self.state.h.shape[2] < rows:
            grown = init_state(self.options, rows)
            if self.state is not None:
                n = self.state.h.shape[2]
                grown = jax.tree.map(lambda g, s: g.at[:, :, :n].set(s), grown, self.state)
            self.state = grown
        return jax.tree.map(lambda s: s[:, :, :rows], self.state)
