"""Embedding speed, side by side: elmo-jax `embed` against AllenNLP's ELMo.

    python -m bench.embed --config allennlp-small [--repeats 3]
    python -m bench.embed --config original --repeats 3

`--config` names a file in configs/ (allennlp-tiny and allennlp-small are the
AllenNLP harness's presets). Same weights (random, in the original hdf5 layout,
made for that config by the AllenNLP peer's make_weights.py), same 30 real sentences (744 tokens, the bilm-tf fixture set),
batch 32, same timer (the peer's time_reps: 1 warm-up, then 5 timed passes; the
first call, which compiles, is reported separately). The two run alternately
in separate processes, each after waiting for a quiet machine, `--repeats`
times; medians and spreads are reported. Prints a table, then one JSON line
with `ratio_vs_allennlp` (elmo-jax tokens/s over AllenNLP's).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

from bench import _common


def allennlp_paths():
    venv = os.environ.get("PEERS_VENV") or os.path.join(_common.PEERS_HOME, "allennlp-venv")
    return _common.peer_dir("allennlp"), os.path.join(venv, "bin", "python"), venv


def peer_harness():
    """The AllenNLP peer's bench_embed.py (numpy only: its sentences, batches
    and timer), loaded from the peer's folder, so both sides read the same input."""
    import importlib.util

    path = os.path.join(allennlp_paths()[0], "bench_embed.py")
    spec = importlib.util.spec_from_file_location("peer_bench_embed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights_for(config: str) -> tuple[str, str]:
    """(options.json, lm_weights.hdf5): random weights for the config's model,
    made once by the peer's make_weights.py (which AllenNLP then loads)."""
    import subprocess

    peer, py, venv = allennlp_paths()
    _common.ensure_setup("allennlp", venv)
    d = os.path.join(os.environ.get("ELMO_PEER_WEIGHTS_DIR")
                     or os.path.join(_common.PEERS_HOME, "elmo_weights"), "by-config", config)
    os.makedirs(d, exist_ok=True)
    wanted = os.path.join(d, "wanted_options.json")
    _common.load_config(config).model.for_inference().to_json(wanted)
    # custom weights land in d/custom/; make_weights skips the work when they are there
    subprocess.run([py, os.path.join(peer, "make_weights.py"), "--preset", "custom",
                    "--options", wanted, "--out-dir", d, "--seed", "0", "--no-verify"],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(d, "custom", "options.json"), os.path.join(d, "custom", "lm_weights.hdf5")


def run_allennlp(config: str) -> dict:
    peer, py, _ = allennlp_paths()
    options, weights = weights_for(config)
    return _common.run_child([py, os.path.join(peer, "bench_embed.py"), "--options", options,
                              "--weights", weights, "--wait-quiet", "120", "--retries", "2"])


def run_elmo_jax(config: str, dtype: str) -> dict:
    return _common.run_child([sys.executable, "-m", __spec__.name, "--worker",
                              "--config", config, "--dtype", dtype],
                             env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS",
                                                                               "cpu")))


def worker(config: str, dtype: str) -> dict:
    """One elmo-jax measurement, in its own process."""
    import jax.numpy as jnp

    be = peer_harness()  # the peer's numpy-only input and timer

    import elmo_jax

    options_file, weights_file = weights_for(config)
    options = elmo_jax.ElmoOptions.from_json(options_file)
    t0 = time.perf_counter()
    elmo = elmo_jax.Elmo(elmo_jax.load_weights(weights_file, options), options,
                         dtype=jnp.dtype(dtype))
    load_s = time.perf_counter() - t0
    sentences = be.load_bench_sentences()
    batches = be.make_batches(sentences, 32)
    n_tokens = be.count_tokens(batches)

    def run_once():
        for batch in batches:
            elmo.embed_sentences(batch, batch_size=32)  # returns numpy: computation done

    t0 = time.perf_counter()
    run_once()
    first_call_s = time.perf_counter() - t0
    busy = be.wait_quiet(120)
    times, info = be.time_reps(run_once, warmup=1, reps=5, max_seconds=100)
    flops = _common.forward_flops_per_token(options)
    n_positions = n_tokens + 2 * len(sentences)  # <S> and </S> go through the LSTMs too
    total_flops = n_positions * (flops["token_encoder"] + flops["lstm"])
    res = be.summarize(times, n_tokens, impl="elmo-jax", config=config, dtype=dtype,
                       load_s=round(load_s, 2), first_call_s=round(first_call_s, 2),
                       system_busy_before=busy, **info)
    res["gflops_per_s"] = round(total_flops / res["median_s"] / 1e9, 1)
    # read before the probes below, whose large arrays the peer never allocates
    res["peak_rss_mib_embed"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    # the walls, measured in this process: the matmul peak in the row's dtype, DRAM
    # bandwidth, and the bytes the LSTMs must stream (each batch's longest sentence
    # + <S>/</S> sequential steps; weights in the row's dtype)
    steps = sum(max(len(s) for s in b) + 2 for b in batches)
    moved = _common.lstm_stream_bytes(options, 32, steps, jnp.dtype(dtype).itemsize, train=False,
                                      positions=n_positions)
    res["limit"] = _common.limit_column(
        total_flops, res["median_s"], _common.matmul_peak_gflops(dtype), sum(moved.values()),
        _common.memory_bandwidth_gbs())
    res["limit"]["bytes_per_pass"] = moved
    res["matmul_peak_gflops_per_s"] = res["limit"]["matmul_peak_gflops_per_s"]
    res["glibc_tunables"] = os.environ.get("GLIBC_TUNABLES", "")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="allennlp-small", help="a configs/ name: allennlp-tiny, "
                    "allennlp-small (the peer's presets), original, ...")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each")
    ap.add_argument("--dtype", default="float32", help="elmo-jax matmul dtype")
    ap.add_argument("--skip-peer", action="store_true", help="time elmo-jax only")
    ap.add_argument("--json-out", help="also write the summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _common.run_as_the_commands()
        print(json.dumps(worker(args.config, args.dtype)))
        return 0
    weights_for(args.config)
    runs = {"allennlp": [], "elmo-jax": []}
    for r in range(args.repeats):
        if not args.skip_peer:
            runs["allennlp"].append(run_allennlp(args.config))
        runs["elmo-jax"].append(run_elmo_jax(args.config, args.dtype))
        print(f"[bench] repeat {r + 1}: " + ", ".join(
            f"{k} {v[-1]['tokens_per_s']:.0f} tok/s" for k, v in runs.items() if v),
            file=sys.stderr, flush=True)
    summary = {"benchmark": "embed", "config": args.config, "dtype": args.dtype,
               "batch_size": 32, **_common.machine()}
    print(f"\nembed, config {args.config}, 30 sentences / 744 tokens, batch 32, "
          f"{args.repeats} alternating runs each")
    summary.update(_common.print_runs(
        runs, rss=lambda r: r.get("peak_rss_mib_embed", r["peak_rss_mib_measured"]),
        first=lambda r: r.get("first_call_s", r.get("load_s", 0)), first_label="first call s"))
    ours = runs["elmo-jax"]
    summary["elmo_jax_gflops_per_s"] = statistics.median(r["gflops_per_s"] for r in ours)
    summary["matmul_peak_gflops_per_s"] = statistics.median(r["matmul_peak_gflops_per_s"]
                                                            for r in ours)
    summary["limit"] = _common.median_limit([r["limit"] for r in ours])
    print(f"elmo-jax achieves {summary['elmo_jax_gflops_per_s']} GFLOP/s of useful work; "
          f"a {args.dtype} matmul peaks at {summary['matmul_peak_gflops_per_s']} GFLOP/s here")
    _common.print_limit(summary["limit"])
    return _common.finish(summary, runs, "allennlp", args.json_out)


if __name__ == "__main__":
    sys.exit(main())
