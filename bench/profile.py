"""Where the time goes: the pieces of elmo-jax's train step and embed, timed
separately (best of a few runs, after compilation), and XLA's matmul speed on
the shapes that matter next to numpy's BLAS on the same machine.

    python -m bench.profile --config bilm-tf-small
    python -m bench.profile --config original --embed original
    python -m bench.profile --config original --dtype bfloat16

`--config` (a configs/ name) is profiled as bench/train.py trains it, on the
same data; `--embed NAME` adds embed's breakdown as bench/embed.py runs it;
`--dtype` is the matmul dtype of the train step and of the LSTM pieces.
"""
from __future__ import annotations

import argparse
import json

from bench import _common


def best_ms(f, *args, n=3):
    return round(1e3 * min(_common.call_times(f, *args, n=n)), 1)


def matmuls(shapes):
    """GFLOP/s of XLA and numpy on [M,K]x[K,N] (M the batch rows): XLA with the
    weights as stored, transposed, and feature-major ([N,K] weights times the
    rows as [K,M] columns, the layout of kernels.lstm_cell)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    out = {}
    for M, K, N in shapes:
        a = np.random.rand(M, K).astype(np.float32)
        b = np.random.rand(K, N).astype(np.float32)
        fl = 2 * M * K * N / 1e9
        ja, jb, jbt = jnp.asarray(a), jnp.asarray(b), jnp.asarray(np.ascontiguousarray(b.T))
        jat = jnp.asarray(np.ascontiguousarray(a.T))
        kn = jax.jit(lambda a, b: a @ b)
        nk = jax.jit(lambda a, bt: jnp.einsum("mk,nk->mn", a, bt))
        feature_major = jax.jit(lambda bt, at: jnp.einsum("nk,km->nm", bt, at))
        t_np = min(_common.call_times(lambda: a @ b, n=20, warmup=False))
        out[f"{M}x{K}x{N}"] = {"xla_gflops": _gflops(fl, kn, ja, jb),
                               "xla_transposed_gflops": _gflops(fl, nk, ja, jbt),
                               "xla_feature_major_gflops": _gflops(fl, feature_major, jbt, jat),
                               "numpy_blas_gflops": round(fl / t_np)}
    return out


def _gflops(gflop, f, *args):
    """GFLOP/s of f(*args), best of 20 (unrounded times: the small products
    take well under 0.1 ms)."""
    return round(gflop / min(_common.call_times(f, *args, n=20)))


def train_breakdown(name: str, dtype: str = "float32") -> dict:
    import jax
    import jax.numpy as jnp

    from bench import train as bench_train
    from elmo_jax.core.bilm import BiLM
    from elmo_jax.core.softmax import sampled_softmax
    from elmo_jax.training.steps import make_optimizer

    config, vocab, built, state, feed = bench_train.setup(name, dtype)
    options = config.model
    B, U, P = options.batch_size, options.unroll_steps, options.lstm.projection_dim
    batch, _, _ = feed.next()
    model = BiLM(options, dtype=jnp.dtype(dtype))
    bilm = state.params["bilm"]
    x = 0.1 * jnp.ones((2, B, U, P))
    mask = jnp.ones((B, U), bool)
    rng = jax.random.PRNGKey(0)
    h = jax.random.normal(rng, (2 * B * U, P))
    tx = make_optimizer(options, config.train)
    grads = jax.tree.map(jnp.ones_like, state.params)

    def tokens(p):
        return model.apply({"params": p}, batch["token_chars"], method=BiLM.encode_tokens).sum()

    def lstms(p):
        return model.apply({"params": p}, x, mask, state.lstm_state)[0].sum()

    def softmax(w, b):
        return sampled_softmax(rng, w, b, h, batch["targets"].reshape(-1),
                               options.n_negative_samples_batch).mean()

    holder = {"state": built.init(None, None)}  # the step donates its state: thread it

    def one_step():
        holder["state"], metrics = built.step(holder["state"], batch)
        return metrics

    full_step_ms = best_ms(one_step)
    return {
        "distinct_tokens_encoded": int(batch["token_chars"].shape[1]),
        "positions_per_step": 2 * B * U,
        "full_step_ms": full_step_ms,
        "token_encoder_forward_ms": best_ms(jax.jit(tokens), bilm),
        "token_encoder_forward_backward_ms": best_ms(jax.jit(jax.grad(tokens)), bilm),
        "lstms_forward_ms": best_ms(jax.jit(lstms), bilm),
        "lstms_forward_backward_ms": best_ms(jax.jit(jax.grad(lstms)), bilm),
        "sampled_softmax_forward_backward_ms": best_ms(
            jax.jit(jax.grad(softmax, argnums=(0, 1))), state.params["softmax"]["w"],
            state.params["softmax"]["b"]),
        "optimizer_update_ms": best_ms(jax.jit(lambda g, o, p: tx.update(g, o, p)), grads,
                                       state.opt_state, state.params),
    }


def embed_breakdown(config: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from elmo_jax import ElmoOptions, load_weights
    from elmo_jax.core.chars import token_to_char_ids, trim_padding
    from elmo_jax.core.embedding import embed_token_vectors, encode_tokens
    from elmo_jax.core.bilm import packed_segments
    from elmo_jax.core.batching import round_up

    from bench import embed as bench_embed

    be = bench_embed.peer_harness()

    options_file, weights_file = bench_embed.weights_for(config)
    options = ElmoOptions.from_json(options_file)
    params = jax.device_put(load_weights(weights_file, options))
    sentences = sorted(be.load_bench_sentences(), key=len, reverse=True)
    distinct = list(dict.fromkeys(w for s in sentences for w in s))
    ids = np.zeros((round_up(len(distinct), 16), options.char_cnn.max_characters_per_token),
                   np.int32)
    for i, w in enumerate(distinct):
        ids[i] = token_to_char_ids(w)
    ids = trim_padding(ids, options.char_cnn.widest_filter)  # as Elmo._encode
    T = round_up(len(sentences[0]) + 2, 8) - 2
    tokens = np.random.randn(32, T, options.lstm.projection_dim).astype(np.float32)
    mask = np.zeros((32, T), bool)
    for b, s in enumerate(sentences):
        mask[b, :len(s)] = True
    segments = packed_segments(mask.sum(1) + 2)
    return {
        "distinct_tokens": len(distinct),
        "encode_distinct_tokens_ms": best_ms(lambda: encode_tokens(params, ids, options)),
        "lstms_packed_ms": best_ms(lambda: embed_token_vectors(params, tokens, mask, options,
                                                               segments=segments).layers),
        "lstms_unpacked_ms": best_ms(lambda: embed_token_vectors(params, tokens, mask,
                                                                 options).layers),
        "lstms_packed_bf16_ms": best_ms(lambda: embed_token_vectors(
            params, tokens, mask, options, segments=segments, dtype=jnp.bfloat16).layers),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="bilm-tf-small", help="a configs/ name to train")
    ap.add_argument("--embed", metavar="CONFIG", help="also embed's breakdown for this config")
    ap.add_argument("--dtype", default="float32", help="the train step's matmul dtype")
    args = ap.parse_args(argv)
    _common.run_as_the_commands()
    out = {"config": args.config, "dtype": args.dtype, **_common.machine(),
           "train (bench/train.py)": train_breakdown(args.config, args.dtype)}
    if args.embed:
        out[f"embed {args.embed} (bench/embed.py)"] = embed_breakdown(args.embed)
    o = _common.load_config(args.config).model
    D, P, B, U = o.lstm.dim, o.lstm.projection_dim, o.batch_size, o.unroll_steps
    # recurrent, input, projection, and the backward pass's recurrent product
    shapes = [(B, P, 4 * D), (B * U, P, 4 * D), (B, D, P), (B, 4 * D, P)]
    if args.embed:  # the embedded model's recurrent matmul at batch 32
        e = _common.load_config(args.embed).model.lstm
        shapes.append((32, e.projection_dim, 4 * e.dim))
    out["matmul"] = matmuls(sorted(set(shapes)))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
