"""Training speed, side by side: elmo-jax's train step against bilm-tf's trainer.

    python -m bench.train --config bilm-tf-small [--repeats 3]
    python -m bench.train --config original --repeats 3

`--config` names a file in configs/: the same model and training settings are
given to both (bilm-tf's harness gets every model field as a flag). Same
corpus (the bilm-tf peer's KJV Bible, 913K tokens), same vocabulary (its first
10,000 entries), same measure: tokens per step / median step time after the
warm-up steps, a step being batch preparation plus the update, with the LSTM
state carried. elmo-jax runs the step `train.py` runs (`create_train_step`),
in the loop it runs: the next batch is made on the host while the device
computes the step (bilm-tf makes its batches in ~2 ms before each step).
A step that compiles (the first, and each batch of a new shape: token tables
of a new number of rows or characters) is left out of the median and listed.
The two run alternately in separate processes after waiting for a quiet
machine; each process's peak memory is read from the kernel. Prints a table,
then one JSON line with `ratio_vs_bilm_tf` (elmo-jax tokens/s over bilm-tf's).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from bench import _common

VOCAB_SIZE = 10000


def default_steps(options) -> tuple[int, int]:
    """(steps, warm-up steps): few for the 4096-cell model, whose steps take seconds."""
    return (10, 2) if options.lstm.dim >= 2048 else (110, 10)


def data_paths():
    d = _common.bilm_tf_data_dir()
    return os.path.join(d, "train.txt"), os.path.join(d, "vocab_full.txt")


def ensure_peer():
    _common.ensure_setup("bilm_tf", _common.bilm_tf_venv())
    corpus, vocab = data_paths()
    if not os.path.exists(corpus):
        sys.exit(f"error: the peer's corpus is missing ({corpus}); run "
                 f"bash {_common.peer_dir('bilm_tf')}/setup.sh")


def peer_flags(options) -> list[str]:
    """The config's model as bilm-tf harness flags (its preset only supplies defaults)."""
    lo, c = options.lstm, options.char_cnn
    return ["--lstm-dim", str(lo.dim), "--projection-dim", str(lo.projection_dim),
            "--filters", json.dumps([list(f) for f in c.filters]), "--n-highway", str(c.n_highway),
            "--char-embed-dim", str(c.embedding_dim), "--batch-size", str(options.batch_size),
            "--unroll-steps", str(options.unroll_steps), "--vocab-size", str(VOCAB_SIZE),
            "--n-negative-samples", str(options.n_negative_samples_batch),
            "--dropout", str(options.dropout), "--all-clip-norm-val", str(options.all_clip_norm_val)]


def run_bilm_tf(options, steps, warmup):
    bench = os.path.join(_common.peer_dir("bilm_tf"), "bench_train.py")
    return _common.run_child([sys.executable, bench, *peer_flags(options), "--steps", str(steps),
                              "--warmup", str(warmup), "--wait-quiet", "120", "--quiet-bilm"])


def run_elmo_jax(config, steps, warmup, dtype, unroll):
    return _common.run_child([sys.executable, "-m", __spec__.name, "--worker", "--config",
                              config, "--steps", str(steps), "--warmup", str(warmup),
                              "--dtype", dtype, "--scan-unroll", str(unroll)],
                             env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS",
                                                                               "cpu")))


def setup(name, dtype="float32", unroll=1):
    """(config, vocabulary, the step train.py runs, a fresh state, its batches
    as train.py's loop makes them: `loop.make_batcher`, placed on the mesh)."""
    from elmo_jax import training
    from elmo_jax.config import DataConfig
    from elmo_jax.training.loop import make_batcher
    from elmo_jax.core.vocab import Vocabulary, read_word_list

    config = _common.load_config(name)
    corpus, vocab_full = data_paths()
    vocab = Vocabulary(read_word_list(vocab_full)[:VOCAB_SIZE])
    config = config.replace(model=config.model.replace(n_tokens_vocab=len(vocab)),
                            train=dataclasses.replace(config.train, compute_dtype=dtype,
                                                      scan_unroll=unroll),
                            data=DataConfig(train_files=corpus))
    mesh = training.train_mesh(config.model, config.train, len(vocab))
    built = training.create_train_step(config.model, config.train, len(vocab), mesh)
    feed = Feed(make_batcher(config, vocab, mesh), mesh)
    return config, vocab, built, built.init(None, None), feed


class Feed:
    """Global batches in order, each with the data position after it and its
    number (the loop's `feeding.Feeder` without its thread: timed steps here
    include no other thread's work)."""

    def __init__(self, batcher, mesh):
        self.batcher, self.mesh = batcher, mesh

    def next(self):
        from elmo_jax.training.partitioning import global_batch

        batch = global_batch(next(self.batcher), self.mesh)
        return batch, self.batcher.position(), self.batcher.batches


def worker(name, steps, warmup, dtype, unroll) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from elmo_jax.training.plan import train_flops

    config, vocab, built, state, feed = setup(name, dtype, unroll)
    options = config.model
    busy = _common.wait_quiet(120)
    times, ppl, distinct, compiled = [], [], [], []
    compiles = _common.CompileCount()
    cpu0 = time.process_time()
    batch, _, _ = feed.next()
    for i in range(steps):
        t0 = time.perf_counter()
        compiles_before = compiles.n
        state, m = built.step(state, batch)
        # a batch of a new shape (its token table's rows or characters) compiles the
        # step once; like the first step's, that time is left out and reported
        compiled.append(compiles.n > compiles_before)
        distinct.append(int(np.any(np.asarray(batch["token_chars"]) != 0, axis=-1).sum()))
        if i + 1 < steps:  # the next batch made while the device computes, as train.py's loop
            batch, _, _ = feed.next()
        loss = float(m["loss"])
        times.append(time.perf_counter() - t0)
        ppl.append(round(float(2.718281828 ** min(loss, 50)), 1))
    measured = [t for i, t in enumerate(times) if i >= warmup and not compiled[i]]
    if len(measured) < 3:
        raise RuntimeError(f"only {len(measured)} of {steps - warmup} steps ran without "
                           "compiling: give more --steps")
    tokens = options.batch_size * options.unroll_steps
    med = statistics.median(measured)
    # the walls, measured in this process after the timed steps
    useful = train_flops(options, len(vocab), False, tokens, statistics.median(distinct))
    moved = _common.lstm_stream_bytes(options, options.batch_size, options.unroll_steps,
                                      np.dtype(jnp.dtype(dtype)).itemsize, train=True)
    limit = _common.limit_column(useful, med, _common.matmul_peak_gflops(dtype),
                                 sum(moved.values()), _common.memory_bandwidth_gbs())
    limit["bytes_per_pass"] = moved
    return {"impl": "elmo-jax", "config": name, "dtype": dtype, "scan_unroll": unroll,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            "limit": limit, "distinct_tokens_per_step": statistics.median(distinct),
            "tokens_per_step": tokens, "steps": steps, "warmup": warmup,
            "median_step_s": round(med, 4), "tokens_per_s": round(tokens / med, 1),
            "first_step_s": round(times[0], 2), "step_times_s": [round(t, 4) for t in times],
            "compiling_steps": [i for i, c in enumerate(compiled) if c],
            "steps_measured": len(measured),
            "cpu_util": round((time.process_time() - cpu0) / sum(times), 2),
            "system_busy_before_cores": round(busy, 2), "ppl_trajectory": ppl,
            "trainable_params": int(sum(x.size for x in jax.tree.leaves(state.params)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="bilm-tf-small", help="a configs/ name: "
                    "bilm-tf-small (the peer's CPU preset) or original")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each")
    ap.add_argument("--steps", type=int, help="training steps per run (default by model size)")
    ap.add_argument("--warmup", type=int, help="steps left out of the median")
    ap.add_argument("--dtype", default="float32", help="elmo-jax matmul dtype")
    ap.add_argument("--scan-unroll", type=int, default=1)
    ap.add_argument("--skip-peer", action="store_true", help="time elmo-jax only")
    ap.add_argument("--json-out", help="also write the summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    options = _common.load_config(args.config).model
    default = default_steps(options)
    steps, warmup = args.steps or default[0], args.warmup or default[1]
    if args.worker:
        _common.run_as_the_commands()
        print(json.dumps(worker(args.config, steps, warmup, args.dtype, args.scan_unroll)))
        return 0
    if not args.skip_peer:
        ensure_peer()
    runs = {"bilm-tf": [], "elmo-jax": []}
    for r in range(args.repeats):
        if not args.skip_peer:
            runs["bilm-tf"].append(run_bilm_tf(options, steps, warmup))
        runs["elmo-jax"].append(run_elmo_jax(args.config, steps, warmup, args.dtype,
                                             args.scan_unroll))
        print(f"[bench] repeat {r + 1}: " + ", ".join(
            f"{k} {v[-1]['tokens_per_s']:.0f} tok/s" for k, v in runs.items() if v),
            file=sys.stderr, flush=True)
    summary = {"benchmark": "train", "config": args.config, "dtype": args.dtype,
               "steps": steps, "warmup": warmup, "batch_size": options.batch_size,
               "unroll_steps": options.unroll_steps,
               "negatives": options.n_negative_samples_batch, "vocab_size": VOCAB_SIZE,
               **_common.machine()}
    print(f"\ntrain, config {args.config}, batch {options.batch_size} x unroll "
          f"{options.unroll_steps}, "
          f"{steps} steps ({warmup} warm-up), {args.repeats} alternating runs each")
    summary.update(_common.print_runs(runs, rss=lambda r: r["peak_rss_mib_measured"],
                                      first=lambda r: r["first_step_s"],
                                      first_label="first step s"))
    summary["limit"] = _common.median_limit([r["limit"] for r in runs["elmo-jax"]])
    _common.print_limit(summary["limit"])
    return _common.finish(summary, runs, "bilm-tf", args.json_out)


if __name__ == "__main__":
    sys.exit(main())
