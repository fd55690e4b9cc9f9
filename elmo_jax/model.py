"""The biLM in Flax: character encoder, LSTM with projection, both directions.

Shapes: B batch rows, T positions, C characters per token, E char-embedding
width, F = sum of filter counts, P projection width, D LSTM cells, L layers.

`BiLM.__call__` is the one forward of both directions, which training and
`embed` both call: it takes the two *readings* of the input (forward, and
backward already reversed, each read left to right) and returns every layer of
both directions and the new state. Who makes the readings: bilm-tf's training
streams come from `data.Batcher` (a backward reading there is the reversed
sentence stream, cut in windows, which no device-side flip of a window can
produce); whole sentences (`embed`) go through `BiLM.sentences`, the one place
that adds `<S>`/`</S>` and reverses rows on the device.

The two directions run in one `lax.scan` over stacked weights (leading axis 2:
forward, backward). The input-to-gates matmul for all positions happens outside
the scan, leaving only the recurrent matmuls inside it.

Gates are ordered (i, f, g, o) and the bias does not include TensorFlow's
`forget_bias=1.0`, which is added at run time as in TF's LSTMCell; `weights.py`
is the only place that knows TF's names and gate order.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.options import CHAR_TABLE_ROWS, ElmoOptions

FORGET_BIAS = 1.0  # TF LSTMCell's default, never stored in the weights


class LSTMState(NamedTuple):
    """Recurrent state after the last real position of each row.

    h: [L, 2, B, P] projected outputs (clipped); c: [L, 2, B, D] cells (clipped).
    Axis 1 is the direction: 0 forward, 1 backward."""
    h: jax.Array
    c: jax.Array


def init_state(options: ElmoOptions, batch_size: int, dtype=jnp.float32) -> LSTMState:
    """A zero LSTMState for `batch_size` rows."""
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


def lstm_cell(w_h_t, w_proj_t, cell_clip, proj_clip, h, c, gx):
    """TF's LSTMCell with projection and clipping, both directions at once,
    feature-major (batch rows on the last axis).

    w_h_t: [2, 4D, P] and w_proj_t: [2, P, D], the recurrent and projection
    matrices transposed; h: [2, P, B], c: [2, D, B]; gx: gates from the input,
    bias included [2, 4D, B]. Every product is then a wide matrix times a few
    columns, W @ h, which the CPU's GEMM runs 1.1-2.5x faster than the same
    product batch-major (h @ W.T) at 8-128 rows (BENCHMARKS.md, "Where the
    time goes").
    Returns (h_new, c_new) and what the backward pass needs: the gates before
    their activations [2, 4D, B] and the projection before clipping [2, P, B]
    (the backward pass recomputes the activations and the raw cell from them,
    which saves a sixth of the per-step residuals)."""
    dt = w_h_t.dtype
    gates = gx + jnp.einsum("dgp,dpb->dgb", w_h_t, h.astype(dt),
                            preferred_element_type=jnp.float32)
    si, sf, tg, so, c_raw = _cell_update(gates, c)
    h_raw = jnp.einsum("dpk,dkb->dpb", w_proj_t,
                       (so * jnp.tanh(_clip(c_raw, cell_clip))).astype(dt),
                       preferred_element_type=jnp.float32)
    return (_clip(h_raw, proj_clip), _clip(c_raw, cell_clip)), (gates, h_raw)


def _cell_update(gates, c):
    """Gate activations (i, f, g, o) and the new cell before clipping."""
    i, f, g, o = jnp.split(gates, 4, axis=1)
    si, sf, tg, so = (jax.nn.sigmoid(i), jax.nn.sigmoid(f + FORGET_BIAS), jnp.tanh(g),
                      jax.nn.sigmoid(o))
    return si, sf, tg, so, sf * c + si * tg


def _clip(x, limit):
    return x if limit is None else jnp.clip(x, -limit, limit)


def _inside(x, limit):
    """d clip(x) / dx as TensorFlow's clip_by_value has it: the gradient passes
    at the limits themselves (-limit <= x <= limit)."""
    return 1.0 if limit is None else (jnp.abs(x) <= limit).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def lstm_scan(cell_clip, proj_clip, unroll, w_h_t, w_proj_t, gx, mask, h0, c0):
    """`lstm_cell` over time, feature-major: gx [T, 2, 4D, B] gates from the
    input, mask [T, B] float (1 real, 0 padding), h0 [2, P, B], c0 [2, D, B]
    -> (outputs [T, 2, P, B], (h, c)); a padded position keeps the state and
    outputs zeros.

    Differentiable, with a hand-written backward pass
    that keeps only the sequential work inside the reverse scan: the weight
    gradients are one large matmul over all time steps afterwards (as cuDNN
    does), instead of T small ones accumulated step by step."""
    (h, c), (out, _) = _lstm_forward(cell_clip, proj_clip, unroll, w_h_t, w_proj_t, gx, mask,
                                     h0, c0, save=False)
    return out, (h, c)


def _lstm_forward(cell_clip, proj_clip, unroll, w_h_t, w_proj_t, gx, mask, h0, c0, save):
    def step(carry, inputs):
        h, c = carry
        g_x, m = inputs
        (h_new, c_new), parts = lstm_cell(w_h_t, w_proj_t, cell_clip, proj_clip, h, c, g_x)
        keep = m[None, None, :].astype(bool)
        saved = (h, c) + parts if save else None
        return ((jnp.where(keep, h_new, h), jnp.where(keep, c_new, c)),
                (jnp.where(keep, h_new, 0.0), saved))

    return jax.lax.scan(step, (h0, c0), (gx, mask), unroll=unroll)


def _lstm_scan_fwd(cell_clip, proj_clip, unroll, w_h_t, w_proj_t, gx, mask, h0, c0):
    (h, c), (out, saved) = _lstm_forward(cell_clip, proj_clip, unroll, w_h_t, w_proj_t, gx,
                                         mask, h0, c0, save=True)
    return (out, (h, c)), (w_h_t, w_proj_t, mask, saved)


def _lstm_scan_bwd(cell_clip, proj_clip, unroll, residuals, cotangents):
    w_h_t, w_proj_t, mask, saved = residuals
    d_out, (dh_T, dc_T) = cotangents
    dt = w_h_t.dtype
    # going backwards the matrices multiply from the other side: the
    # untransposed copies keep the fast layout (wide matrix on the left,
    # contracted on its last axis)
    w_h, w_proj = jnp.swapaxes(w_h_t, 1, 2), jnp.swapaxes(w_proj_t, 1, 2)

    def step(carry, inputs):
        dh, dc = carry
        dout, m, (h, c, gates, h_raw) = inputs
        m = m[None, None, :]
        si, sf, tg, so, c_raw = _cell_update(gates, c)
        tc = jnp.tanh(_clip(c_raw, cell_clip))
        dh_raw = m * (dout + dh) * _inside(h_raw, proj_clip)
        dmv = jnp.einsum("dkp,dpb->dkb", w_proj, dh_raw.astype(dt),
                         preferred_element_type=jnp.float32)
        dc_raw = (m * dc + dmv * so * (1 - tc * tc)) * _inside(c_raw, cell_clip)
        dgates = jnp.concatenate([dc_raw * tg * si * (1 - si), dc_raw * c * sf * (1 - sf),
                                  dc_raw * si * (1 - tg * tg), dmv * tc * so * (1 - so)], 1)
        dh_prev = jnp.einsum("dpg,dgb->dpb", w_h, dgates.astype(dt),
                             preferred_element_type=jnp.float32) + (1 - m) * dh
        dc_prev = dc_raw * sf + (1 - m) * dc
        return (dh_prev, dc_prev), (dgates, dh_raw, so * tc)

    (dh0, dc0), (dgates, dh_raw, mv) = jax.lax.scan(
        step, (dh_T, dc_T), (d_out, mask, saved), reverse=True, unroll=unroll)
    # the weight gradients: one product over all time steps each, in the matmul
    # dtype (bf16 products accumulate in float32, like the forward's). Time and
    # rows are moved next to each other first: contracting one contiguous last
    # axis rather than (t, b) in place runs 1.1-1.4x faster, copy included.
    # The products come out in the parameters' own layout (w_h [2, P, 4D],
    # w_proj [2, D, P]): the transpose back then cancels LSTMLayer's
    h_cols, g_cols, mv_cols, r_cols = (_steps_last(a.astype(dt))
                                       for a in (saved[0], dgates, mv, dh_raw))
    d_w_h = jnp.einsum("dpn,dgn->dpg", h_cols, g_cols,
                       preferred_element_type=jnp.float32).astype(dt)
    d_w_proj = jnp.einsum("dkn,dpn->dkp", mv_cols, r_cols,
                          preferred_element_type=jnp.float32).astype(dt)
    d_w_h_t, d_w_proj_t = jnp.swapaxes(d_w_h, 1, 2), jnp.swapaxes(d_w_proj, 1, 2)
    return d_w_h_t, d_w_proj_t, dgates, jnp.zeros_like(mask), dh0, dc0


def _steps_last(a):
    """[T, 2, K, B] -> [2, K, T B]: the steps and rows of the scan's layout as
    one contiguous column axis, column t B + b."""
    return jnp.transpose(a, (1, 2, 0, 3)).reshape(a.shape[1], a.shape[2], -1)


lstm_scan.defvjp(_lstm_scan_fwd, _lstm_scan_bwd)


@jax.custom_vjp
def input_gates(x, w_in):
    """The gates from the input of every position, in the scan's layout:
    x [2, n, T, Pin] (the layer input, batch-major) and w_in [2, Pin, 4D] ->
    [T, 2, 4D, n] float32, both operands in the matmul dtype.

    The forward is x @ w_in as stored, then one transpose; the backward runs
    feature-major over the (t, row) columns, so that the gate gradients leave
    the scan's layout moving whole rows of n (moving the 4D axis past the rows
    there cost 6% of the `original` training step; in the forward, the
    feature-major product would transpose w_in for each packed embed segment,
    which made embed 20% slower). Its gradients are products in the matmul
    dtype as well: autodiff's would multiply the float32 cotangent by a bf16
    operand, which XLA runs as a float32 product (at half the bf16 rate here)."""
    return _input_gates_fwd(x, w_in)[0]


def _columns(x):
    """[2, n, T, Pin] -> [2, Pin, T n], column t n + b."""
    return jnp.transpose(x, (0, 3, 2, 1)).reshape(x.shape[0], x.shape[3], -1)


def _input_gates_fwd(x, w_in):
    g = jnp.einsum("dntp,dpg->dntg", x, w_in, preferred_element_type=jnp.float32)
    return jnp.transpose(g, (2, 0, 3, 1)), (_columns(x), w_in)


def _input_gates_bwd(residuals, d_gates):
    x_cols, w_in = residuals
    T, _, _, n = d_gates.shape
    dt = w_in.dtype
    d_cols = _steps_last(d_gates.astype(dt))                               # [2, 4D, T n]
    d_x = jnp.einsum("dpg,dgm->dpm", w_in, d_cols, preferred_element_type=jnp.float32)
    d_x = jnp.transpose(d_x.reshape(2, -1, T, n), (0, 3, 2, 1))           # [2, n, T, Pin]
    d_w = jnp.einsum("dpm,dgm->dpg", x_cols, d_cols, preferred_element_type=jnp.float32)
    return d_x.astype(x_cols.dtype), d_w.astype(dt)


input_gates.defvjp(_input_gates_fwd, _input_gates_bwd)


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
        for t0, t1, n in self.segments or ((0, T, B),):
            # the input-to-gates matmul for all positions of the segment, outside the scan
            gx = input_gates(x[:, :n, t0:t1].astype(self.dtype), w_in) + b[None, :, :, None]
            out, (hn, cn) = lstm_scan(self.cell_clip, proj_clip, self.unroll, w_h_t,
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
    B, T = len(lengths), -(-max(lengths, default=0) // quantum) * quantum
    ends = []  # (end position, rows active until then), the groups from the last one up
    for g in range(0, B, quantum):
        end = min(-(-lengths[g] // quantum) * quantum, T)
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

    @nn.compact
    def __call__(self, x, mask, state: LSTMState, deterministic: bool = True):
        """x: [2, B, T, P], mask: [B, T] -> (outputs [L, 2, B, T, P], LSTMState)."""
        o = self.options.lstm
        outputs, hs, cs = [], [], []
        for layer in range(o.n_layers):
            x_in = nn.Dropout(self.options.dropout)(x, deterministic=deterministic)
            out, (h, c) = LSTMLayer(o.dim, o.projection_dim, o.cell_clip, o.proj_clip,
                                    unroll=self.unroll, dtype=self.dtype, segments=self.segments,
                                    name=f"layer_{layer}")(x_in, mask, state.h[layer], state.c[layer])
            if o.use_skip_connections and layer > 0:
                out = out + x_in
            outputs.append(out)
            hs.append(h)
            cs.append(c)
            x = out
        return jnp.stack(outputs), LSTMState(jnp.stack(hs), jnp.stack(cs))


# ----------------------------------------------------------------------------
# the character encoder


@jax.custom_vjp
def char_conv_max(x, kernel):
    """1-D convolution without padding, max-pooled over positions: x [N, C, E]
    (embedded characters) and kernel [w, E, F] -> [N, F].

    XLA's own convolution runs the forward well, but its gradients with 16
    input channels run at 30-50 GFLOP/s on the CPU; the hand-written backward
    pass does both as plain matrix products over the [N (C - w + 1), w E]
    character windows (2.5x faster for width 7 x 1024 filters, BENCHMARKS.md).
    It keeps the position of each maximum [N, F] rather than the convolution
    output (the max's own gradient would need that, and two passes over it);
    of tied maxima the first gets the gradient."""
    return _conv_max_fwd(x, kernel)[0]


def _conv(x, kernel):
    return jax.lax.conv_general_dilated(x, kernel, (1,), "VALID",
                                        dimension_numbers=("NWC", "WIO", "NWC"))


def _conv_max_fwd(x, kernel):
    y = _conv(x, kernel)                                                # [N, L, F]
    pooled = jnp.max(y, axis=1)
    # the first maximum's position, from two plain reductions (XLA's CPU argmax,
    # a reduction over (value, index) pairs, runs several times slower)
    L = y.shape[1]
    positions = jnp.arange(L, dtype=jnp.int32)[None, :, None]
    first = jnp.min(jnp.where(y == pooled[:, None, :], positions, L), axis=1)
    return pooled, (x, kernel, first)


def _conv_max_bwd(residuals, d_pooled):
    x, kernel, first = residuals
    (N, C, E), (w, _, F) = x.shape, kernel.shape
    L = C - w + 1
    d_y = jnp.where(jnp.arange(L)[None, :, None] == first[:, None, :], d_pooled[:, None, :],
                    0.0).astype(x.dtype).reshape(N * L, F)
    windows = jnp.concatenate([x[:, i:i + L] for i in range(w)], axis=-1)   # [N, L, w E]
    d_kernel = jnp.einsum("mk,mf->kf", windows.reshape(N * L, w * E), d_y).reshape(w, E, F)
    d_windows = jnp.einsum("mf,kf->mk", d_y, kernel.reshape(w * E, F)).reshape(N, L, w, E)
    # each window position i contributes to the characters i .. i + L - 1
    d_x = sum(jnp.pad(d_windows[:, :, i], ((0, 0), (i, w - 1 - i), (0, 0))) for i in range(w))
    return d_x.astype(x.dtype), d_kernel.astype(kernel.dtype)


char_conv_max.defvjp(_conv_max_fwd, _conv_max_bwd)


class CharConv(nn.Module):
    """One filter bank: x [N, C, E] -> [N, F], `char_conv_max` plus the bias;
    nn.Conv's parameter names (kernel [w, E, F], bias [F]), which `weights.py`
    maps to bilm-tf's W_cnn_i / b_cnn_i."""
    features: int
    width: int
    kernel_init: Callable

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (self.width, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        # the bias after the max: the same numbers (rounding is monotonic), without
        # a pass over the [N, C - w + 1, F] convolution output
        return char_conv_max(x, kernel) + bias


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
    """char ids [..., C] -> token vectors [..., P]: embedding, convolutions, max
    over positions, activation, highway layers, linear projection."""
    options: ElmoOptions

    @nn.compact
    def __call__(self, char_ids):
        c = self.options.char_cnn
        C = char_ids.shape[-1]
        table = self.param("char_embed", _uniform(1.0), (CHAR_TABLE_ROWS, c.embedding_dim))
        x = jnp.take(table, char_ids.reshape(-1, C), axis=0)
        pooled = []
        for i, (width, num) in enumerate(c.filters):
            if c.activation == "relu":
                init = _uniform(0.05)  # Kim et al. 2015, as bilm-tf
            else:
                init = nn.initializers.normal(float(np.sqrt(1.0 / (width * c.embedding_dim))))
            pooled.append(CharConv(num, width, kernel_init=init, name=f"conv_{i}")(x))
        act = jax.nn.relu if c.activation == "relu" else jnp.tanh
        x = act(jnp.concatenate(pooled, axis=-1))
        for k in range(c.n_highway):
            x = Highway(name=f"highway_{k}")(x)
        x = nn.Dense(self.options.lstm.projection_dim, name="proj",
                     kernel_init=nn.initializers.normal(float(np.sqrt(1.0 / c.n_filters))))(x)
        return x.reshape(char_ids.shape[:-1] + (x.shape[-1],))


class BiLM(nn.Module):
    """The bidirectional language model without its softmax."""
    options: ElmoOptions
    unroll: int = 1
    dtype: jnp.dtype = jnp.float32
    segments: tuple | None = None  # see LSTMLayer

    def setup(self):
        self.char_encoder = CharEncoder(self.options)
        self.lstm = BiLSTM(self.options, unroll=self.unroll, dtype=self.dtype,
                           segments=self.segments)

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
        C = self.options.char_cnn.max_characters_per_token
        bos, eos = self.encode_tokens(jnp.stack([jnp.asarray(chars.bos_char_ids(C)),
                                                 jnp.asarray(chars.eos_char_ids(C))]))
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
    """Random biLM parameters initialised as bilm-tf does (row 0 of the char
    embedding, the padding id, is zero)."""
    C = options.char_cnn.max_characters_per_token
    params = BiLM(options).init(rng, jnp.zeros((2, 1, 1, C), jnp.int32), jnp.ones((1, 1), bool),
                                init_state(options, 1))["params"]
    table = params["char_encoder"]["char_embed"]
    params["char_encoder"]["char_embed"] = table.at[0].set(0.0)
    return params
