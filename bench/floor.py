"""The products floor of a row: every matrix product (and convolution) that
one training step or one embed pass runs, each timed by XLA on its own shape,
in the layout and dtype the model uses, and summed.

    python -m bench.floor --config bilm-tf-small
    python -m bench.floor --config original --dtype bfloat16
    python -m bench.floor --embed allennlp-small
    python -m bench.floor --embed original --dtype bfloat16

The per-step recurrent products are timed inside a `lax.scan` over the
window's steps (as the model runs them, so the loop's own cost is in), the
others as one jitted call each; best of `--repeats`. The sum is the time the
step would take if it did nothing but its products, each at the speed XLA
reaches on that shape on this machine: no elementwise work, no copies, no
optimizer. Set against the measured step (`bench/results/`), it says how much
of a row's gap to its goal a faster schedule could still close, and how much
would need faster matrix kernels than XLA's for these shapes.
"""
from __future__ import annotations

import argparse
import sys

from bench import _common

# the token encoder's rows in a training step: the distinct-token table as
# bench/profile.py measures it on the bench data; and its characters per token
# once chars.trim_padding has cut the spellings (24 in almost every batch there)
DISTINCT_TOKENS = {"bilm-tf-small": 384, "original": 1024}
TRAIN_CHAR_WIDTH = 24


def _normal(key, shape, dtype):
    import jax

    return (0.05 * jax.random.normal(key, shape)).astype(dtype)


def lstm_products(options, rows, steps, train: bool, dtype):
    """(name, count, fn, args) for one layer's products over `steps` positions
    of `rows` rows, both directions batched, as core/bilm.py lays them out; count
    is the number of layers."""
    import jax
    import jax.numpy as jnp

    lo = options.lstm
    P, D, L = lo.projection_dim, lo.dim, lo.n_layers
    G, N, f32 = 4 * D, rows * steps, jnp.float32
    k = iter(jax.random.split(jax.random.PRNGKey(0), 32))

    def per_step(spec, w_shape, x_shape):
        w, xs = _normal(next(k), w_shape, dtype), _normal(next(k), (steps,) + x_shape, dtype)

        def run(w, xs):
            def body(_, x):
                return None, jnp.einsum(spec, w, x, preferred_element_type=f32)
            return jax.lax.scan(body, None, xs)[1]
        return jax.jit(run), (w, xs)

    def once(spec, a_shape, b_shape):
        a, b = _normal(next(k), a_shape, dtype), _normal(next(k), b_shape, dtype)
        return jax.jit(lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=f32)), (a, b)

    items = [("input gates", once("dnp,dpg->dng", (2, N, P), (2, P, G))),
             ("recurrent, per step", per_step("dgp,dpb->dgb", (2, G, P), (2, P, rows)))]
    if D != P:
        items.append(("projection, per step", per_step("dpk,dkb->dpb", (2, P, D), (2, D, rows))))
    if train:
        items += [("backward: through the projection, per step",
                   per_step("dkp,dpb->dkb", (2, D, P), (2, P, rows))),
                  ("backward: through the recurrent matrix, per step",
                   per_step("dpg,dgb->dpb", (2, P, G), (2, G, rows))),
                  ("backward: recurrent weight gradient",
                   once("dpn,dgn->dpg", (2, P, N), (2, G, N))),
                  ("backward: projection weight gradient",
                   once("dkn,dpn->dkp", (2, D, N), (2, P, N))),
                  ("backward: input gates, input gradient",
                   once("dpg,dgm->dpm", (2, P, G), (2, G, N))),
                  ("backward: input gates, weight gradient",
                   once("dpm,dgm->dpg", (2, P, N), (2, G, N)))]
    return [(name, L, f, args) for name, (f, args) in items]


def segment_products(options, segments, dtype):
    """The packed embed schedule: each segment (t0, t1, rows) runs its own
    input-gate product and per-step products."""
    out = []
    for t0, t1, n in segments:
        for name, count, f, args in lstm_products(options, n, t1 - t0, False, dtype):
            out.append((f"{name} [{t1 - t0} steps x {n} rows]", count, f, args))
    return out


def encoder_products(options, n_tokens, train: bool, C: int):
    """The token encoder's convolutions, highway and projection products over
    `n_tokens` distinct tokens of C characters (float32, as the model runs them)."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.kernels import char_conv_max

    c, P = options.char_cnn, options.lstm.projection_dim
    E, F = c.embedding_dim, c.n_filters
    k = iter(jax.random.split(jax.random.PRNGKey(1), 64))
    f32 = jnp.float32
    x = _normal(next(k), (n_tokens, C, E), f32)
    items = []
    for w, n in c.filters:  # the max over positions comes with it (one reduction)
        kern = _normal(next(k), (w, E, n), f32)
        items.append((f"convolution width {w} x {n}", 1, jax.jit(char_conv_max), (x, kern)))
        if train:
            g = _normal(next(k), (n_tokens, n), f32)
            bwd = jax.jit(lambda x, kern, g: jax.vjp(char_conv_max, x, kern)[1](g))
            items.append((f"backward: convolution width {w} x {n}", 1, bwd, (x, kern, g)))
    h = _normal(next(k), (n_tokens, F), f32)
    for name, wshape in (("highway", (F, F)), ("projection", (F, P))):
        count = 2 * c.n_highway if name == "highway" else 1
        w = _normal(next(k), wshape, f32)
        items.append((f"encoder {name}", count, jax.jit(jnp.matmul), (h, w)))
        if train:
            g = _normal(next(k), (n_tokens, wshape[1]), f32)
            items.append((f"backward: encoder {name}, input gradient", count,
                          jax.jit(lambda g, w: g @ w.T), (g, w)))
            items.append((f"backward: encoder {name}, weight gradient", count,
                          jax.jit(lambda h, g: h.T @ g), (h, g)))
    return items


def softmax_products(options, rows):
    """The sampled softmax of both directions: logits, and their two gradients
    (float32, as steps.py runs them)."""
    import jax
    import jax.numpy as jnp

    P, S = options.lstm.projection_dim, options.n_negative_samples_batch
    k = jax.random.split(jax.random.PRNGKey(2), 3)
    f32 = jnp.float32
    h, w, g = (_normal(k[0], (2, rows, P), f32), _normal(k[1], (2, S, P), f32),
               _normal(k[2], (2, rows, S), f32))
    return [("sampled softmax logits", 1, jax.jit(lambda h, w: jnp.einsum("dnp,dsp->dns", h, w)),
             (h, w)),
            ("backward: softmax, hidden gradient", 1,
             jax.jit(lambda g, w: jnp.einsum("dns,dsp->dnp", g, w)), (g, w)),
            ("backward: softmax, weight gradient", 1,
             jax.jit(lambda g, h: jnp.einsum("dns,dnp->dsp", g, h)), (g, h))]


def measure(items, repeats):
    rows, total = [], 0.0
    for name, count, f, args in items:
        s = min(_common.call_times(f, *args, n=repeats))
        total += count * s
        rows.append({"product": name, "count": count, "ms_each": round(1e3 * s, 2)})
        print(f"{name:60s} {count:3d} x {1e3 * s:9.2f} ms")
    return rows, total


def train_floor(config_name, dtype, repeats):
    import jax.numpy as jnp

    options = _common.load_config(config_name).model
    B, T = options.batch_size, options.unroll_steps
    dt = jnp.dtype(dtype)
    items = (lstm_products(options, B, T, True, dt)
             + encoder_products(options, DISTINCT_TOKENS.get(config_name, 2 * B * T // 3), True,
                                TRAIN_CHAR_WIDTH)
             + softmax_products(options, B * T))
    return measure(items, repeats)


def embed_floor(config_name, dtype, repeats):
    import jax.numpy as jnp
    import numpy as np

    from bench import embed as bench_embed
    from elmo_jax.core.chars import token_to_char_ids, trim_padding
    from elmo_jax.core.bilm import packed_segments
    from elmo_jax.core.batching import next_power_of_two, round_up

    be = bench_embed.peer_harness()  # the peer's sentences

    options = _common.load_config(config_name).model
    batches = be.make_batches(be.load_bench_sentences(), 32)
    items, schedules = [], []
    for batch in batches:  # Elmo._embed_batch's schedule: rows padded to 8, with <S>, </S>
        lengths = sorted((len(s) + 2 for s in batch), reverse=True)
        lengths += [2] * (round_up(len(lengths), 8) - len(lengths))
        schedules.append(packed_segments(lengths))
        items += segment_products(options, schedules[-1], jnp.dtype(dtype))
        # each batch's distinct tokens, padded to a power of two and cut to the
        # characters the CNN needs (Elmo._encode)
        distinct = list(dict.fromkeys(t for s in batch for t in s))
        C = trim_padding(np.stack([token_to_char_ids(t) for t in distinct]),
                         options.char_cnn.widest_filter).shape[-1]
        items += encoder_products(options, next_power_of_two(len(distinct), 16), False, C)
    print("packed schedules:", schedules)
    return measure(items, repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", help="a training row's configs/ name")
    which.add_argument("--embed", metavar="CONFIG", help="an embed row's configs/ name")
    ap.add_argument("--dtype", default="float32", help="the LSTM matmul dtype")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    _common.run_as_the_commands()
    if args.config:
        rows, total = train_floor(args.config, args.dtype, args.repeats)
    else:
        rows, total = embed_floor(args.embed, args.dtype, args.repeats)
    res = {"benchmark": "floor", "row": "train" if args.config else "embed",
           "config": args.config or args.embed, "dtype": args.dtype, **_common.machine(),
           "products_floor_ms": round(1e3 * total, 1),
           "matmul_peak_gflops_per_s": round(_common.matmul_peak_gflops(args.dtype), 1),
           "products": rows}
    print(f"products floor: {1e3 * total:.1f} ms")
    _common.write_json(args.json_out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
