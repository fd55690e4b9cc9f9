"""The GPU check: the `original` config's train step and `embed` at large batch,
in float32 and bfloat16, on whatever accelerator JAX finds. Installs nothing;
prints one line per measurement and a final JSON line.

    python -m bench.gpu [--train-batch 512] [--embed-batch 1024] [--seconds 20]
    python -m bench.gpu --only loop [--loop-steps 300] [--train-batch 512]
    python -m bench.gpu --only corpus [--corpus-lines 100000] [--batch-tokens 65536]

Reported per run: tokens/s (median step), achieved TFLOP/s of useful work
(forward: token encoder + LSTMs; training: 3x the forward plus the sampled
softmax), and the device's peak memory; beside them, the plan's prediction
(`train.py plan --target`'s figures for this chip: the same program's
compiled peak bytes, and the step time at 40% and 60% of the chip's peak,
`elmo_jax/training/targets.py`). Goals (issue): training >= 200k
tokens/s (an epoch of the 1B Word Benchmark in under an hour), embed >= 1M
tokens/s. Synthetic data: random tokens of real-looking lengths, since only
speed is measured here.

`--only loop` runs the real training loop (`train_and_evaluate`: the input
pipeline, the batches placed ahead, the compiled shapes) on a synthetic Zipf
corpus for `--loop-steps` steps, traces its last 100 steps, and prints the
devices' busy fraction in them (`bench.trace.device_busy_fraction`), the
loop's tokens/s and the programs compiled after step 1, beside the plan's
step time at 40% and 60% of the chip's peak.

`--only corpus` (and `--only embed`, after the fixed batch) runs the corpus job (`corpus.embed_corpus`: text in, a store
written, the reader and writer threads) over a synthetic corpus, once to
compile and once traced, and prints its tokens/s and the devices' busy
fraction over its batches.
"""
from __future__ import annotations

import argparse
import json
import statistics

from bench import _common


def peak_memory_gib() -> float | None:
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return round(peak / 2**30, 2) if peak else None


def prediction(compiled, flops: float, dtype: str) -> dict:
    """What the plan predicts of a compiled program on this device: its peak
    bytes (XLA's memory analysis) and, for a chip in the targets' table, the
    step time at 40% and 60% of the chip's peak for `dtype` matmuls."""
    from elmo_jax.training.plan import compiled_figures

    figures = compiled_figures(compiled)
    return {"predicted_peak_memory_gib": round(figures["peak"] / 2**30, 2),
            **predicted_step(flops, dtype)}


def predicted_step(flops: float, dtype: str) -> dict:
    """For a chip in the targets' table: a step of `flops` at 40% and 60% of its
    peak for `dtype` matmuls (nothing for another device)."""
    import jax

    from elmo_jax.training.targets import chip_target

    target = chip_target(jax.devices()[0].device_kind)
    if target is None:
        return {}
    return {"predicted_step_s": {f"{u:.0%}": round(flops / (target.peak(dtype) * 1e12 * u), 4)
                                 for u in (0.4, 0.6)},
            "chip_peak_tflops": target.peak(dtype)}


def bench_train(config, batch, dtype, seconds, vocab_size):
    import dataclasses

    import numpy as np

    from elmo_jax import training

    options = config.model.replace(batch_size=batch, n_tokens_vocab=vocab_size)
    train = dataclasses.replace(config.train, compute_dtype=dtype)
    mesh = training.train_mesh(options, train, vocab_size)
    built = training.create_train_step(options, train, vocab_size, mesh)  # train.py's step
    state, step = built.init(None, None), built.step
    rng = np.random.default_rng(0)
    U, C = options.unroll_steps, options.char_cnn.max_characters_per_token
    n_groups = mesh.size
    n_table = 2048
    chars = rng.integers(1, 261, (n_groups, n_table, C)).astype(np.int32)
    chars[:, :, 12:] = 261  # words of ~10 bytes, then padding
    local = {"token_chars": chars,
             "token_index": rng.integers(1, n_table, (2, batch, U)).astype(np.int32),
             "targets": np.minimum(rng.zipf(1.3, (2, batch, U)), vocab_size - 1).astype(np.int32),
             "mask": np.ones((batch, U), bool)}
    data = training.global_batch(local, mesh)
    holder = {"state": state}

    def one():
        holder["state"], m = step(holder["state"], data)
        return m["loss"]

    med = statistics.median(_common.call_times(one, n=3, min_seconds=seconds))
    tokens = batch * U
    f = _common.forward_flops_per_token(options)
    softmax = 2 * 2 * (options.n_negative_samples_batch + 1) * options.lstm.projection_dim
    # token encoder on the distinct tokens of the batch (here n_table per group)
    flops = 3 * (tokens * (f["lstm"] + softmax) + n_groups * n_table * f["token_encoder"])
    planned = prediction(step.lower(built.abstract_state, data).compile(), flops, dtype)
    return {"what": "train", "dtype": dtype, "batch": batch, "tokens_per_s": round(tokens / med),
            "tflops_per_s": round(flops / med / 1e12, 1), "step_s": round(med, 4),
            "peak_memory_gib": peak_memory_gib(), **planned}


def bench_embed(options, params, batch, dtype, seconds, length=27):
    import jax.numpy as jnp
    import numpy as np

    from elmo_jax.core.embedding import embed_token_vectors_program, embed_token_vectors, encode_tokens

    rng = np.random.default_rng(0)
    C = options.char_cnn.max_characters_per_token
    n_distinct = 4096
    chars = rng.integers(1, 257, (n_distinct, C)).astype(np.int32)
    chars[:, 12:] = 261
    index = rng.integers(0, n_distinct, (batch, length))
    mask = jnp.ones((batch, length), bool)
    dt = jnp.dtype(dtype)

    def one():
        vecs = encode_tokens(params, chars, options)           # each distinct token once
        out = embed_token_vectors(params, vecs[index], mask, options, dtype=dt)
        return out.layers

    med = statistics.median(_common.call_times(one, n=3, min_seconds=seconds))
    f = _common.forward_flops_per_token(options)
    tokens = batch * length
    flops = (tokens + 2 * batch) * f["lstm"] + n_distinct * f["token_encoder"]
    vecs = encode_tokens(params, chars, options)
    lstm = embed_token_vectors_program.lower(params, vecs[index], mask, options.network(),
                                      dtype=dt).compile()
    planned = prediction(lstm, flops, dtype)  # the LSTMs' program, most of the step
    return {"what": "embed", "dtype": dtype, "batch": batch, "tokens_per_s": round(tokens / med),
            "tflops_per_s": round(flops / med / 1e12, 1), "step_s": round(med, 4),
            "peak_memory_gib": peak_memory_gib(), **planned}


def bench_loop(config, batch, dtype, steps):
    import dataclasses
    import os
    import tempfile

    from bench.host_input import synthetic_corpus
    from bench.trace import device_busy_fraction
    from elmo_jax import training
    from elmo_jax.config import DataConfig
    from elmo_jax.data import vocab_from_files

    work = tempfile.mkdtemp(prefix="elmo-jax-gpu-loop-")
    corpus = os.path.join(work, "corpus.txt")
    synthetic_corpus(corpus)
    vocab, _ = vocab_from_files(corpus, max_vocab=100_000)
    vocab.to_file(os.path.join(work, "vocab.txt"))
    first = max(1, steps - 99)
    config = config.replace(
        model=config.model.replace(batch_size=batch, n_tokens_vocab=None),
        train=dataclasses.replace(config.train, compute_dtype=dtype, max_steps=steps,
                                  log_every=max(1, steps // 3), checkpoint_every=10**9,
                                  checkpoint_every_seconds=None, transfer_guard="disallow",
                                  profile_steps=f"{first}:{steps}"),
        data=DataConfig(train_files=corpus, vocab_file=os.path.join(work, "vocab.txt")))
    run = os.path.join(work, "run")
    last = training.train_and_evaluate(config, run, progress=False)
    out = {"what": "loop", "dtype": dtype, "batch": batch, "steps": steps,
           "tokens_per_s": round(last["tokens_per_sec"]),
           "compiled_since_step_1": last.get("compiled_since_step_1"),
           **device_busy_fraction(os.path.join(run, "tensorboard"))}
    options = config.model.replace(n_tokens_vocab=len(vocab))
    f = _common.forward_flops_per_token(options)
    softmax = 2 * 2 * (options.n_negative_samples_batch + 1) * options.lstm.projection_dim
    flops = 3 * batch * options.unroll_steps * (f["lstm"] + softmax + f["token_encoder"])
    return {**out, **predicted_step(flops, dtype)}


def bench_corpus(options, params, dtype, lines, batch_tokens):
    import os
    import tempfile

    import jax
    import numpy as np

    from bench.host_input import synthetic_corpus
    from bench.trace import device_busy_fraction
    from elmo_jax.corpus import CorpusSettings, embed_corpus

    work = tempfile.mkdtemp(prefix="elmo-jax-gpu-corpus-")
    corpus = os.path.join(work, "corpus.txt")
    synthetic_corpus(corpus, sentences=lines)
    settings = CorpusSettings(compute_dtype=dtype, dtype="float16", batch_tokens=batch_tokens,
                              chunk_lines=8192)
    params = jax.tree.map(np.asarray, params)
    warm = os.path.join(work, "warm.txt")
    with open(corpus, encoding="utf-8") as src, open(warm, "w", encoding="utf-8") as dst:
        dst.writelines(line for _, line in zip(range(2000), src))
    embed_corpus(params, options, [warm], os.path.join(work, "warm"), settings)  # compiles
    trace = os.path.join(work, "trace")
    with jax.profiler.trace(trace):
        summary = embed_corpus(params, options, [corpus], os.path.join(work, "store"), settings)
    return {"what": "corpus", "dtype": dtype, "batch_tokens": batch_tokens, "lines": lines,
            "tokens_per_s": round(summary["tokens_per_sec"]), "tokens": summary["tokens"],
            "compile_seconds": summary["compile_seconds"], "devices": summary["devices"],
            **device_busy_fraction(trace, step_name="embed_batch")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-batch", type=int, default=512)
    ap.add_argument("--embed-batch", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=15.0, help="timing per measurement")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--only", choices=["train", "embed", "loop", "corpus"])
    ap.add_argument("--corpus-lines", type=int, default=100_000, help="with --only corpus")
    ap.add_argument("--batch-tokens", type=int, default=65536, help="with --only corpus")
    ap.add_argument("--loop-steps", type=int, default=300, help="with --only loop")
    ap.add_argument("--config", default="original", help="a configs/ name (tiny: smoke test)")
    ap.add_argument("--vocab-size", type=int, default=793471,
                    help="softmax rows (the 1B Word Benchmark's vocabulary by default)")
    args = ap.parse_args(argv)
    import jax

    from elmo_jax import init_params

    config = _common.load_config(args.config)
    options = config.model
    print(f"devices: {jax.devices()}", flush=True)
    results = []
    params = init_params(options, jax.random.PRNGKey(0))
    for dtype in args.dtypes.split(","):
        if args.only in ("loop", "corpus"):
            r = (bench_loop(config, args.train_batch, dtype, args.loop_steps)
                 if args.only == "loop"
                 else bench_corpus(options, params, dtype, args.corpus_lines,
                                   args.batch_tokens))
            print(json.dumps(r), flush=True)
            results.append(r)
            continue
        if args.only != "train":
            r = bench_embed(options, params, args.embed_batch, dtype, args.seconds)
            print(json.dumps(r), flush=True)
            results.append(r)
        if args.only == "embed":  # and the corpus job, text in and a store written
            r = bench_corpus(options, params, dtype, args.corpus_lines, args.batch_tokens)
            print(json.dumps(r), flush=True)
            results.append(r)
        if args.only != "embed":
            r = bench_train(config, args.train_batch, dtype, args.seconds, args.vocab_size)
            print(json.dumps(r), flush=True)
            results.append(r)
    print(json.dumps({"benchmark": "gpu", "device": str(jax.devices()[0]),
                      **_common.machine(), "results": results}))


if __name__ == "__main__":
    main()
