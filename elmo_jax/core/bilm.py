"""The biLM in Flax: character encoder, LSTM with projection, both directions.

Shapes: B batch rows, T positions, C characters per token, E char-embedding
width, F = sum of filter counts, P projection width, D LSTM cells, L layers.

`BiLM.__call__` is the one forward of both directions, which training and
`embed` both call: it takes the two *readings* of the input (forward, and
backward already reversed, each read left to right) and returns every layer of
both directions and the new state. Who makes the readings: bilm-tf's training
streams come from `data.StreamBatcher` (a backward reading there is the reversed
sentence stream, cut in windows, which no device-side flip of a window can
produce); whole sentences (`embed`) go through `BiLM.sentences`, the one place
that adds `<S>`/`</S>` and reverses rows on the device.

The two directions run in one `lax.scan` over stacked weights (leading axis 2:
forward, backward). The input-to-gates matmul for all positions happens outside
the scan, leaving only the recurrent matmuls inside it. The hand-written
kernels (the scan's cell and its backward pass, the input gates, the
character convolution) are in `kernels.py`; this file holds the modules.

Gates are ordered (i, f, g, o) and the bias does not include TensorFlow's
`forget_bias=1.0`, which is added at run time as in TF's LSTMCell; `weights.py`
is the only place that knows TF's names and gate order.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core import chars
from elmo_jax.core.kernels import char_conv_max, input_gates, lstm_scan, plain
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.batching import round_up



class LSTMState(NamedTuple):
    """Recurrent state after the last real position of each row (a pytree).

    Axis 1 is the direction: 0 forward, 1 backward.

    Attributes:
        h: [L, 2, B, P] float32 projected outputs (clipped).
        c: [L, 2, B, D] float32 cells (clipped).
    """
    h: jax.Array
    c: jax.Array


def init_state(options: ElmoOptions, batch_size: int, dtype=jnp.float32) -> LSTMState:
    """The state a sentence starts from: zeros.

    Args:
        options: the biLM's `ElmoOptions` (L layers, D cells, P projection).
        batch_size: B, the rows.
        dtype: the arrays' dtype.

    Returns:
        An `LSTMState` of zeros: h [L, 2, B, P], c [L, 2, B, D].
    """
    L, D, P = options.lstm.n_layers, options.lstm.dim, options.lstm.projection_dim
    return LSTMState(h=jnp.zeros((L, 2, batch_size, P), dtype),
                     c=jnp.zeros((L, 2, batch_size, D), dtype))


# ----------------------------------------------------------------------------
# sequence helpers


def token_mask(char_ids: jax.Array) -> jax.Array:
    """[..., T, C] char ids -> [..., T] bool: a token is real iff any id is > 0."""
    return jnp.any(char_ids > 0, axis=-1)


def reverse_padded(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Reverse the first lengths[b] positions of each row of x [B, T, ...];
    positions past a row's length stay where they are. Its own inverse."""
    T = x.shape[1]
    t = jnp.arange(T)[None, :]
    idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


# ----------------------------------------------------------------------------
# the LSTM


def _uniform(limit: float):
    """U(-limit, limit)."""
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -limit, limit)


def _glorot_rows(fan_in: int, fan_out: int):
    """Glorot-uniform init of one slice of a [fan_in, fan_out] matrix stored in
    pieces (TF initialises W_0 = [w_in; w_h] as one matrix)."""
    return _uniform(float(np.sqrt(6.0 / (fan_in + fan_out))))


class LSTMLayer(nn.Module):
    """One layer, both directions, with projection and clipping (no projection
    when dim == projection_dim, as bilm-tf: the exact identity then stands in
    for it, so it costs one extra D x D product per step).

    `segments` (static) packs a batch whose rows are sorted by length, longest
    first, as AllenNLP's LSTM does: ((t_start, t_end, n_rows), ...) covering
    the positions in order, each computing only the first n_rows rows (rows
    beyond must be padding there). None computes every row at every position."""
    dim: int
    projection_dim: int
    cell_clip: float | None
    proj_clip: float | None
    unroll: int = 1
    dtype: jnp.dtype = jnp.float32  # matmul input dtype; state and gates stay float32
    segments: tuple | None = None
    forward_mode: bool = False  # the kernels' plain formulas (see `embed`)

    @nn.compact
    def __call__(self, x, mask, h0, c0):
        """x: [2, B, T, Pin], mask: [B, T] bool, h0: [2, B, P], c0: [2, B, D]
        -> (outputs [2, B, T, P], (h [2, B, P], c [2, B, D]))."""
        D, P, Pin = self.dim, self.projection_dim, x.shape[-1]
        B, T = mask.shape
        init = _glorot_rows(Pin + P, 4 * D)
        w_in = self.param("w_in", init, (2, Pin, 4 * D))
        w_h = self.param("w_h", init, (2, P, 4 * D))
        b = self.param("b", nn.initializers.zeros, (2, 4 * D))
        if D != P:
            w_proj = self.param("w_proj", _glorot_rows(D, P), (2, D, P))
            proj_clip = self.proj_clip
        else:  # bilm-tf builds no projection then: h = o * tanh(c), and proj_clip is unused
            w_proj, proj_clip = jnp.broadcast_to(jnp.eye(D), (2, D, D)), None
        w_in = w_in.astype(self.dtype)
        w_h_t, w_proj_t = (jnp.swapaxes(w, 1, 2).astype(self.dtype) for w in (w_h, w_proj))
        if self.segments and (self.segments[-1][1] > T or max(n for *_, n in self.segments) > B):
            raise ValueError(f"segments {self.segments} do not fit a batch of {B} x {T}")
        h, c = h0, c0
        pieces = []
        gates, scan = ((plain(input_gates), plain(lstm_scan)) if self.forward_mode
                       else (input_gates, lstm_scan))
        for t0, t1, n in self.segments or ((0, T, B),):
            # the input-to-gates matmul for all positions of the segment, outside the scan
            gx = gates(x[:, :n, t0:t1].astype(self.dtype), w_in) + b[None, :, :, None]
            out, (hn, cn) = scan(self.cell_clip, proj_clip, self.unroll, w_h_t,
                                      w_proj_t, gx, mask[:n, t0:t1].T.astype(jnp.float32),
                                      jnp.swapaxes(h[:, :n], 1, 2), jnp.swapaxes(c[:, :n], 1, 2))
            h = h.at[:, :n].set(jnp.swapaxes(hn, 1, 2))
            c = c.at[:, :n].set(jnp.swapaxes(cn, 1, 2))
            out = jnp.transpose(out, (1, 3, 0, 2))                    # [2, n, t1 - t0, P]
            pieces.append(jnp.pad(out, ((0, 0), (0, B - n), (0, 0), (0, 0))))
        out = jnp.concatenate(pieces, axis=2)
        if out.shape[2] < T:  # positions after the last segment are padding
            out = jnp.pad(out, ((0, 0), (0, 0), (0, T - out.shape[2]), (0, 0)))
        return out, (h, c)


def packed_segments(lengths, quantum: int = 8) -> tuple:
    """The `segments` of LSTMLayer for rows sorted by length (longest first):
    rows go in groups of `quantum`, each group running until its longest row
    ends, rounded up to a multiple of `quantum` positions (fewer distinct
    schedules, so fewer compilations)."""
    lengths = [int(n) for n in lengths]
    if any(a < b for a, b in zip(lengths, lengths[1:])):
        raise ValueError("packed rows must be sorted by length, longest first")
    B, T = len(lengths), round_up(max(lengths, default=0), quantum)
    ends = []  # (end position, rows active until then), the groups from the last one up
    for g in range(0, B, quantum):
        end = min(round_up(lengths[g], quantum), T)
        ends.append((end, min(g + quantum, B)))
    segments, start = [], 0
    for end, rows in sorted(ends, key=lambda e: (e[0], -e[1])):
        if end > start:
            n = max(r for e, r in ends if e >= end)
            segments.append((start, end, n))
            start = end
    return tuple(segments)


class BiLSTM(nn.Module):
    """L layers of LSTMLayer with dropout on each layer's input (bilm-tf's
    DropoutWrapper) and a residual connection around layers >= 1."""
    options: ElmoOptions
    unroll: int = 1
    dtype: jnp.dtype = jnp.float32
    segments: tuple | None = None
    forward_mode: bool = False

    @nn.compact
    def __call__(self, x, mask, state: LSTMState, deterministic: bool = True):
        """x: [2, B, T, P], mask: [B, T] -> (outputs [L, 2, B, T, P], LSTMState)."""
        o = self.options.lstm
        outputs, hs, cs = [], [], []
        for layer in range(o.n_layers):
            x_in = nn.Dropout(self.options.dropout)(x, deterministic=deterministic)
            out, (h, c) = LSTMLayer(o.dim, o.projection_dim, o.cell_clip, o.proj_clip,
                                    unroll=self.unroll, dtype=self.dtype, segments=self.segments,
                                    forward_mode=self.forward_mode, name=f"layer_{layer}")(
                                        x_in, mask, state.h[layer], state.c[layer])
            if o.use_skip_connections and layer > 0:
                out = out + x_in
            outputs.append(out)
            hs.append(h)
            cs.append(c)
            x = out
        return jnp.stack(outputs), LSTMState(jnp.stack(hs), jnp.stack(cs))


# ----------------------------------------------------------------------------
# the character encoder


class CharConv(nn.Module):
    """One filter bank: x [N, C, E] -> [N, F], `char_conv_max` plus the bias;
    nn.Conv's parameter names (kernel [w, E, F], bias [F]), which `weights.py`
    maps to bilm-tf's W_cnn_i / b_cnn_i."""
    features: int
    width: int
    kernel_init: Callable
    forward_mode: bool = False

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (self.width, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        # the bias after the max: the same numbers (rounding is monotonic), without
        # a pass over the [N, C - w + 1, F] convolution output
        return (plain(char_conv_max) if self.forward_mode else char_conv_max)(x, kernel) + bias


class Highway(nn.Module):
    """bilm-tf's highway layer: the gate it calls "carry" weights the transform."""

    @nn.compact
    def __call__(self, x):
        F = x.shape[-1]
        init = nn.initializers.normal(stddev=float(np.sqrt(1.0 / F)))
        w_carry = self.param("w_carry", init, (F, F))
        b_carry = self.param("b_carry", nn.initializers.constant(-2.0), (F,))
        w_transform = self.param("w_transform", init, (F, F))
        b_transform = self.param("b_transform", nn.initializers.zeros, (F,))
        gate = jax.nn.sigmoid(x @ w_carry + b_carry)
        return gate * jax.nn.relu(x @ w_transform + b_transform) + (1.0 - gate) * x


class CharEncoder(nn.Module):
    """char ids [..., I] -> token vectors [..., P]: embedding, convolutions, max
    over positions, activation, highway layers, linear projection. I is the
    options' `ids_per_token`: C characters, and with a word table
    (ELMoForManyLangs) the word id last, whose embedding goes into the
    projection before the highway output."""
    options: ElmoOptions
    forward_mode: bool = False

    @nn.compact
    def __call__(self, char_ids):
        c = self.options.char_cnn
        lead = char_ids.shape[:-1]
        ids = char_ids.reshape(-1, char_ids.shape[-1])
        if c.word_dim:
            ids, word_ids = ids[:, :-1], ids[:, -1]
        table = self.param("char_embed", _uniform(1.0), (c.table_rows, c.embedding_dim))
        x = jnp.take(table, ids, axis=0)
        pooled = []
        for i, (width, num) in enumerate(c.filters):
            if c.activation == "relu":
                init = _uniform(0.05)  # Kim et al. 2015, as bilm-tf
            else:
                init = nn.initializers.normal(float(np.sqrt(1.0 / (width * c.embedding_dim))))
            pooled.append(CharConv(num, width, kernel_init=init, forward_mode=self.forward_mode,
                                   name=f"conv_{i}")(x))
        act = jax.nn.relu if c.activation == "relu" else jnp.tanh
        x = act(jnp.concatenate(pooled, axis=-1))
        for k in range(c.n_highway):
            x = Highway(name=f"highway_{k}")(x)
        if c.word_dim:
            words = self.param("word_embed", _uniform(0.25), (c.n_words, c.word_dim))
            x = jnp.concatenate([jnp.take(words, word_ids, axis=0), x], axis=-1)
        x = nn.Dense(self.options.lstm.projection_dim, name="proj",
                     kernel_init=nn.initializers.normal(float(np.sqrt(1.0 / x.shape[-1]))))(x)
        return x.reshape(lead + (x.shape[-1],))


class BiLM(nn.Module):
    """The bidirectional language model without its softmax."""
    options: ElmoOptions
    unroll: int = 1
    dtype: jnp.dtype = jnp.float32
    segments: tuple | None = None  # see LSTMLayer
    forward_mode: bool = False  # the kernels' plain formulas, for jax.jvp (see `embed`)

    def setup(self):
        self.char_encoder = CharEncoder(self.options, forward_mode=self.forward_mode)
        self.lstm = BiLSTM(self.options, unroll=self.unroll, dtype=self.dtype,
                           segments=self.segments, forward_mode=self.forward_mode)

    def encode_tokens(self, char_ids):
        """[..., C] char ids -> [..., P] context-independent token vectors."""
        return self.char_encoder(char_ids)

    def __call__(self, readings, mask, state: LSTMState, deterministic: bool = True):
        """The forward pass of both directions.

        readings: [2, B, T, P] token vectors, or [2, B, T, C] char ids, of the
                  forward reading and the backward one (already reversed);
        mask:     [B, T] bool, True at real positions (the same for both
                  readings: real positions first in each row);
        state:    LSTMState for B rows to continue from.
        Returns (outputs [L, 2, B, T, P] of every layer and direction, in
        reading order and zero at padding, new LSTMState). Dropout on the
        layer inputs when not `deterministic` (needs a "dropout" rng)."""
        x = readings
        if jnp.issubdtype(x.dtype, jnp.integer):
            x = self.encode_tokens(x)
        x = x * mask[None, :, :, None].astype(x.dtype)
        return self.lstm(x, mask, state, deterministic)

    def sentences(self, tokens, mask, state: LSTMState):
        """Whole sentences: `<S>` and `</S>` added around each row's real
        tokens, the backward reading made by reversing each row, its outputs put
        back in sentence order.

        tokens [B, T, P] token vectors (real tokens first), mask [B, T] ->
        (layers [L+1, B, T+2, 2P]: layer 0 the token vectors duplicated, then
         each LSTM layer's forward half and backward half, with the boundary
         positions; mask [B, T+2]; new LSTMState)."""
        B, T, P = tokens.shape
        bos, eos = self.encode_tokens(jnp.asarray(chars.boundary_ids(self.options.char_cnn)))
        lengths = jnp.sum(mask, axis=1) + 2                            # with <S> and </S>
        t = jnp.arange(T + 2)[None, :, None]
        edge = jnp.zeros((B, 1, P), tokens.dtype)
        x = jnp.concatenate([edge, tokens * mask[..., None], edge], axis=1)
        x = jnp.where(t == 0, bos, jnp.where(t == (lengths - 1)[:, None, None], eos, x))
        full_mask = t[..., 0] < lengths[:, None]                       # [B, T+2]
        outs, new_state = self(jnp.stack([x, reverse_padded(x, lengths)]), full_mask, state)
        fwd = outs[:, 0]
        bwd = jax.vmap(reverse_padded, in_axes=(0, None))(outs[:, 1], lengths)
        layers = jnp.concatenate([jnp.concatenate([x, x], -1)[None],
                                  jnp.concatenate([fwd, bwd], -1)], axis=0)
        return layers, full_mask, new_state


def init_params(options: ElmoOptions, rng: jax.Array) -> dict:
    """Random biLM parameters, initialised as bilm-tf does.

    Args:
        options: the biLM's `ElmoOptions`.
        rng: a `jax.random` key.

    Returns:
        The parameter pytree (`embed`'s `params`; the names of
        docs/formats/export.md); row 0 of the character embedding, the
        padding id, is zero.
    """
    ids = jnp.zeros((2, 1, 1, options.char_cnn.ids_per_token), jnp.int32)
    params = BiLM(options).init(rng, ids, jnp.ones((1, 1), bool), init_state(options, 1))["params"]
    for name in ("char_embed", "word_embed"):  # row 0 is the padding token
        if name in params["char_encoder"]:
            params["char_encoder"][name] = params["char_encoder"][name].at[0].set(0.0)
    return params


def named_leaves(params) -> dict[str, Any]:
    """A parameter tree's leaves by `/`-joined path: {"char_encoder/char_embed":
    leaf, ...} (the jax.export artifact's keys; the names errors give)."""
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


@functools.lru_cache(maxsize=32)
def param_shapes(options: ElmoOptions) -> dict[str, tuple[int, ...]]:
    """{"char_encoder/char_embed": shape, ...}: what `init_params` makes for
    these options (traced for shapes only, once per options)."""
    tree = jax.eval_shape(lambda: init_params(options, jax.random.key(0)))
    return {name: tuple(leaf.shape) for name, leaf in named_leaves(tree).items()}
