"""Training speed, side by side: elmo-jax's train step against bilm-tf's trainer.

    python bench/train.py --config small [--repeats 3]

Same corpus (the bilm-tf peer's KJV Bible, 913K tokens), same vocabulary (its
first 10,000 entries), same model and training configuration (the peer's
presets: `small` 512/128 with 4 filters, batch 32; `original`
2x4096_512_2048cnn_2xhighway, batch 128; unroll 20, 1024 / 8192 negative
samples, Adagrad lr 0.2, clip 10, dropout 0.1), same measure: tokens per step /
median step time after the warm-up steps, a step being batch preparation plus
the update, with the LSTM state carried. The two run alternately in separate
processes after waiting for a quiet machine; each process's peak memory is
read from the kernel. Prints a table, then one JSON line with
`ratio_vs_bilm_tf` (elmo-jax tokens/s over bilm-tf's).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

# bilm_tf/bench_train.py's presets, restated as elmo-jax options.
PRESETS = {
    "small": dict(dim=512, proj=128, filters=[[1, 32], [2, 32], [3, 64], [4, 128]], n_highway=1,
                  batch_size=32, negatives=1024, steps=110, warmup=10),
    "original": dict(dim=4096, proj=512, filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256],
                                                  [6, 512], [7, 1024]], n_highway=2,
                     batch_size=128, negatives=8192, steps=8, warmup=2),
}
VOCAB_SIZE = 10000


def data_paths():
    d = os.environ.get("BILM_TF_DATA_DIR") or os.path.join(_common.PEERS_HOME, "bilm-tf-data")
    return os.path.join(d, "train.txt"), os.path.join(d, "vocab_full.txt")


def ensure_peer():
    venv = os.environ.get("PEERS_TF_VENV") or os.path.join(_common.PEERS_HOME, "bilm-tf-venv")
    _common.ensure_setup("bilm_tf", venv)
    corpus, vocab = data_paths()
    if not os.path.exists(corpus):
        sys.exit(f"error: the peer's corpus is missing ({corpus}); run "
                 f"bash {_common.peer_dir('bilm_tf')}/setup.sh")


def run_bilm_tf(config, steps, warmup):
    bench = os.path.join(_common.peer_dir("bilm_tf"), "bench_train.py")
    return _common.run_child([sys.executable, bench, "--config", config, "--steps", str(steps),
                              "--warmup", str(warmup), "--wait-quiet", "120", "--quiet-bilm"])


def run_elmo_jax(config, steps, warmup, dtype, unroll):
    return _common.run_child([sys.executable, os.path.abspath(__file__), "--worker", "--config",
                              config, "--steps", str(steps), "--warmup", str(warmup),
                              "--dtype", dtype, "--scan-unroll", str(unroll)],
                             env=dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS",
                                                                               "cpu")))


def preset_options(config):
    """The peer's preset as elmo-jax options (bilm-tf's bin/train_elmo.py otherwise)."""
    from elmo_jax import ElmoOptions

    p = PRESETS[config]
    return ElmoOptions.from_dict({
        "lstm": {"dim": p["dim"], "projection_dim": p["proj"], "n_layers": 2, "cell_clip": 3,
                 "proj_clip": 3, "use_skip_connections": True},
        "char_cnn": {"activation": "relu", "embedding": {"dim": 16}, "filters": p["filters"],
                     "n_highway": p["n_highway"], "n_characters": 261,
                     "max_characters_per_token": 50},
        "dropout": 0.1, "batch_size": p["batch_size"], "unroll_steps": 20,
        "n_negative_samples_batch": p["negatives"], "all_clip_norm_val": 10.0})


def worker(config, steps, warmup, dtype, unroll) -> dict:
    import tempfile

    import jax

    from elmo_jax import training
    from elmo_jax.data import Batcher, TextSource
    from elmo_jax.vocab import Vocabulary, read_word_list

    options = preset_options(config)
    config_ = training.TrainConfig(learning_rate=0.2, initial_accumulator_value=1.0,
                                   compute_dtype=dtype, scan_unroll=unroll)
    corpus, vocab_full = data_paths()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("\n".join(read_word_list(vocab_full)[:VOCAB_SIZE]) + "\n")
    vocab = Vocabulary.from_file(fh.name)
    options = options.replace(n_tokens_vocab=len(vocab))
    mesh = training.make_mesh(config_)
    abstract, shardings = training._abstract_state(options, config_, len(vocab),
                                                   options.batch_size, mesh)
    state = jax.jit(lambda: training.init_train_state(options, config_, len(vocab),
                                                      options.batch_size),
                    out_shardings=shardings)()
    tx = training.make_optimizer(options, config_)
    bsh = training.batch_shardings(mesh)
    step_fn = jax.jit(lambda s, b: training.train_step(s, b, options=options, config=config_,
                                                       tx=tx),
                      in_shardings=(shardings, bsh), out_shardings=(shardings, None),
                      donate_argnums=0)
    batcher = Batcher(TextSource(corpus, seed=0), vocab, options.batch_size, options.unroll_steps,
                      n_groups=mesh.shape["data"])
    busy = _common.wait_quiet(120)
    times, ppl = [], []
    cpu0 = time.process_time()
    for i in range(steps):
        t0 = time.perf_counter()
        state, m = step_fn(state, training.global_batch(next(batcher), bsh))
        loss = float(m["loss"])
        times.append(time.perf_counter() - t0)
        ppl.append(round(float(2.718281828 ** min(loss, 50)), 1))
    measured = times[warmup:]
    tokens = options.batch_size * options.unroll_steps
    med = statistics.median(measured)
    return {"impl": "elmo-jax", "config": config, "dtype": dtype, "scan_unroll": unroll,
            "tokens_per_step": tokens, "steps": steps, "warmup": warmup,
            "median_step_s": round(med, 4), "tokens_per_s": round(tokens / med, 1),
            "first_step_s": round(times[0], 2), "step_times_s": [round(t, 4) for t in times],
            "cpu_util": round((time.process_time() - cpu0) / sum(times), 2),
            "system_busy_before_cores": round(busy, 2), "ppl_trajectory": ppl,
            "trainable_params": int(sum(x.size for x in jax.tree.leaves(state.params)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(PRESETS), default="small")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each")
    ap.add_argument("--steps", type=int, help="training steps per run (preset default)")
    ap.add_argument("--warmup", type=int, help="steps left out of the median")
    ap.add_argument("--dtype", default="float32", help="elmo-jax matmul dtype")
    ap.add_argument("--scan-unroll", type=int, default=1)
    ap.add_argument("--skip-peer", action="store_true", help="time elmo-jax only")
    ap.add_argument("--json-out", help="also write the summary here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    p = PRESETS[args.config]
    steps, warmup = args.steps or p["steps"], args.warmup or p["warmup"]
    if args.worker:
        print(json.dumps(worker(args.config, steps, warmup, args.dtype, args.scan_unroll)))
        return 0
    if not args.skip_peer:
        ensure_peer()
    runs = {"bilm-tf": [], "elmo-jax": []}
    for r in range(args.repeats):
        if not args.skip_peer:
            runs["bilm-tf"].append(run_bilm_tf(args.config, steps, warmup))
        runs["elmo-jax"].append(run_elmo_jax(args.config, steps, warmup, args.dtype,
                                             args.scan_unroll))
        print(f"[bench] repeat {r + 1}: " + ", ".join(
            f"{k} {v[-1]['tokens_per_s']:.0f} tok/s" for k, v in runs.items() if v),
            file=sys.stderr, flush=True)
    summary = {"benchmark": "train", "config": args.config, "dtype": args.dtype,
               "steps": steps, "warmup": warmup, "batch_size": p["batch_size"],
               "unroll_steps": 20, "negatives": p["negatives"], "vocab_size": VOCAB_SIZE,
               **_common.machine()}
    print(f"\ntrain, config {args.config}, batch {p['batch_size']} x unroll 20, "
          f"{steps} steps ({warmup} warm-up), {args.repeats} alternating runs each")
    summary.update(_common.print_runs(runs, rss=lambda r: r["peak_rss_mib_measured"],
                                      first=lambda r: r["first_step_s"],
                                      first_label="first step s"))
    if runs["bilm-tf"]:
        summary["ratio_vs_bilm_tf"] = round(summary["elmo_jax_tokens_per_s"]
                                            / summary["bilm_tf_tokens_per_s"], 2)
    summary["runs"] = runs
    _common.write_json(args.json_out, summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
