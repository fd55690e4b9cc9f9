"""The biLM's hand-written kernels, each a pure function with its own backward
pass (`jax.custom_vjp`), as the Flax modules of `bilm.py` call them:

    lstm_cell      TF's LSTMCell with projection and clipping, both directions at once
    lstm_scan      the cell over T positions (`lax.scan`), state held where the mask is 0
    input_gates    the input-to-gates matmul of every position, outside the scan
    char_conv_max  a 1-D convolution max-pooled over positions (the character CNN)

Why hand-written backward passes: the scan's keeps only the sequential work
inside the reverse scan (the weight gradients become one large product after
it), and the convolution's runs as plain matrix products over the character
windows, where XLA's own gradient is slow on the CPU (each docstring gives the
numbers). Tests in test_model.py compare each with `jax.grad` of the plain
formula.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

FORGET_BIAS = 1.0  # TF LSTMCell's default, never stored in the weights


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


def plain(kernel):
    """A kernel's own formula, without its hand-written backward pass (the
    function `jax.custom_vjp` wraps): every transform differentiates it,
    forward mode (`jax.jvp`, `jacfwd`, `hessian`) included, and reverse mode
    with XLA's own gradients."""
    return kernel.fun


def within_clip(x, limit):
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
        dh_raw = m * (dout + dh) * within_clip(h_raw, proj_clip)
        dmv = jnp.einsum("dkp,dpb->dkb", w_proj, dh_raw.astype(dt),
                         preferred_element_type=jnp.float32)
        dc_raw = (m * dc + dmv * so * (1 - tc * tc)) * within_clip(c_raw, cell_clip)
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
    """[T, 2, K, B] -> [2, K, B T]: the rows and steps of the scan's layout as
    one contiguous column axis, column b T + t. Rows major: split over a mesh,
    the rows stay split in the merged axis (each device's columns one block);
    steps major would make GSPMD gather every row to every device first."""
    return jnp.transpose(a, (1, 2, 3, 0)).reshape(a.shape[1], a.shape[2], -1)


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
    """[2, n, T, Pin] -> [2, Pin, n T], column b T + t (as `_steps_last`)."""
    return jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], x.shape[3], -1)


def _input_gates_fwd(x, w_in):
    g = jnp.einsum("dntp,dpg->dntg", x, w_in, preferred_element_type=jnp.float32)
    return jnp.transpose(g, (2, 0, 3, 1)), (_columns(x), w_in)


def _input_gates_bwd(residuals, d_gates):
    x_cols, w_in = residuals
    T, _, _, n = d_gates.shape
    dt = w_in.dtype
    d_cols = _steps_last(d_gates.astype(dt))                               # [2, 4D, n T]
    d_x = jnp.einsum("dpg,dgm->dpm", w_in, d_cols, preferred_element_type=jnp.float32)
    d_x = jnp.transpose(d_x.reshape(2, -1, n, T), (0, 2, 3, 1))           # [2, n, T, Pin]
    d_w = jnp.einsum("dpm,dgm->dpg", x_cols, d_cols, preferred_element_type=jnp.float32)
    return d_x.astype(x_cols.dtype), d_w.astype(dt)


input_gates.defvjp(_input_gates_fwd, _input_gates_bwd)


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
