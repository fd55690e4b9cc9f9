"""Learning, side by side and across seeds: held-out perplexity of each
direction, bilm-tf's own `train()`/`test()` against elmo-jax's trainer on the
same text, vocabulary, model and number of steps.

    python -m bench.learn --seeds 0 1 2 --steps 300 1000 3000 --json-out bench/results/learn.json
    python -m bench.learn --systems elmo-jax --seeds 0 1 2 --steps 300 \
        --set train.softmax_init=bilm-tf --label "elmo-jax, bilm-tf's start"

Text: the bilm-tf peer's KJV Bible (31,102 verses), every 50th verse held out;
the vocabulary is the training part's 10,000 most frequent entries (specials
included), one file for both. Model and recipe: `--config` (default
bilm-tf-small: 512/128 LSTMs, batch 32 x 20, 1,024 negatives, Adagrad 0.2).
Each (system, seed) trains once to the largest horizon and is scored with the
full softmax at every horizon: bilm-tf by its `test()` (bench/learn_bilm_tf.py),
elmo-jax by `train.py`'s evaluation (the run resumed exactly from one horizon to
the next). The runs are separate processes, one after another; `--json-out`
keeps every run (a rerun of the same label and seed replaces it) and the table
printed at the end reads them all: per horizon, each seed's forward / backward
perplexity, the median over seeds of the two directions' perplexity (exp of
their mean loss, bilm-tf's number) and the worst seed's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from bench import _common

HELD_OUT_EVERY = 50
VOCAB_SIZE = 10000


def prepare_text(out_dir: str) -> dict:
    """train.txt, heldout.txt and vocab.txt from the peer's corpus (idempotent)."""
    from elmo_jax.core.vocab import build_vocab, count_tokens

    src = os.path.join(_common.bilm_tf_data_dir(), "train.txt")
    if not os.path.exists(src):
        sys.exit(f"error: the bilm-tf peer's corpus is missing ({src}); run "
                 f"bash {_common.peer_dir('bilm_tf')}/setup.sh")
    paths = {k: os.path.join(out_dir, f"{k}.txt") for k in ("train", "heldout", "vocab")}
    if not all(os.path.exists(p) for p in paths.values()):
        os.makedirs(out_dir, exist_ok=True)
        with open(src, encoding="utf-8") as fh:
            lines = [line for line in fh.read().split("\n") if line.strip()]
        held = [s for i, s in enumerate(lines) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
        train = [s for i, s in enumerate(lines) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
        for key, part in (("train", train), ("heldout", held)):
            with open(paths[key], "w", encoding="utf-8") as fh:
                fh.write("\n".join(part) + "\n")
        vocab = build_vocab(count_tokens(s.split() for s in train), VOCAB_SIZE)
        vocab.to_file(paths["vocab"])
    return paths


def run_bilm_tf(config_name: str, paths: dict, seed: int, steps: list[int]) -> dict:
    venv = _common.bilm_tf_venv()
    _common.ensure_setup("bilm_tf", venv)
    config = _common.load_config(config_name)
    with tempfile.TemporaryDirectory(prefix="learn_bilm_tf_") as work:
        options = os.path.join(work, "options.json")
        with open(options, "w") as fh:
            json.dump(config.model.to_dict(), fh)
        return _common.run_child(
            [os.path.join(venv, "bin", "python"),
             os.path.join(os.path.dirname(os.path.abspath(__file__)), "learn_bilm_tf.py"),
             "--options", options, "--train", paths["train"], "--heldout", paths["heldout"],
             "--vocab", paths["vocab"], "--seed", str(seed), "--steps", *map(str, steps),
             "--workdir", os.path.join(work, "run"), "--peer_dir", _common.peer_dir("bilm_tf")],
            timeout=6 * 3600)


def run_elmo_jax(config_name: str, paths: dict, seed: int, steps: list[int],
                 overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", __spec__.name, "--worker", "--config", config_name,
           "--seeds", str(seed), "--steps", *map(str, steps), "--data_dir",
           os.path.dirname(paths["train"])]
    for o in overrides:
        cmd += ["--set", o]
    return _common.run_child(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=6 * 3600)


def worker(config_name: str, data_dir: str, seed: int, steps: list[int],
           overrides: list[str]) -> dict:
    """elmo-jax, as train.py trains: one workdir, resumed from horizon to horizon."""
    import time

    from elmo_jax.config import load_config
    from elmo_jax.training import train_and_evaluate

    _common.run_as_the_commands()
    paths = prepare_text(data_dir)
    sets = [f"train.seed={seed}", f"data.train_files={paths['train']}",
            f"data.vocab_file={paths['vocab']}", f"data.eval_files={paths['heldout']}",
            "train.checkpoint_every=1000000", "train.log_every=100",
            "train.eval_batch_size=256", *overrides]
    results, t0 = [], time.time()
    with tempfile.TemporaryDirectory(prefix="learn_elmo_jax_") as workdir:
        for step in sorted(set(steps)):
            config = load_config(config_name,
                                 sets + [f"train.max_steps={step}"])
            last = train_and_evaluate(config, workdir, progress=False)
            results.append({"step": step, "ppl": last["eval_ppl"],
                            "ppl_forward": last["eval_ppl_forward"],
                            "ppl_backward": last["eval_ppl_backward"]})
            print(f"[elmo-jax] seed {seed} step {step}: {results[-1]}", file=sys.stderr,
                  flush=True)
    return {"system": "elmo-jax", "seed": seed, "results": results,
            "train_s": round(time.time() - t0, 1), "overrides": overrides}


def table(runs: list[dict]) -> str:
    """Markdown: one row per (label, horizon)."""
    rows = ["| system | steps | seeds | median | worst seed | max direction ratio | "
            "each seed: forward / backward |", "| --- | --- | --- | --- | --- | --- | --- |"]
    labels = list(dict.fromkeys(r["label"] for r in runs))
    for label in labels:
        mine = sorted((r for r in runs if r["label"] == label), key=lambda r: r["seed"])
        horizons = sorted({x["step"] for r in mine for x in r["results"]})
        for step in horizons:
            at = [(r["seed"], x) for r in mine for x in r["results"] if x["step"] == step]
            ppl = [x["ppl"] for _, x in at]
            ratio = max(max(x["ppl_forward"], x["ppl_backward"])
                        / min(x["ppl_forward"], x["ppl_backward"]) for _, x in at)
            each = "; ".join(f"{s}: {x['ppl_forward']:,.1f} / {x['ppl_backward']:,.1f}"
                             for s, x in at)
            rows.append(f"| {label} | {step:,} | {len(at)} | {statistics.median(ppl):,.1f} | "
                        f"{max(ppl):,.1f} | {ratio:,.2f} | {each} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="bilm-tf-small")
    ap.add_argument("--systems", nargs="+", default=["bilm-tf", "elmo-jax"],
                    choices=["bilm-tf", "elmo-jax"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, nargs="+", default=[300, 1000, 3000])
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="elmo-jax config override PATH=VALUE (repeatable)")
    ap.add_argument("--label", help="the elmo-jax rows' name (default: elmo-jax)")
    ap.add_argument("--data_dir", default=os.path.join(_common.PEERS_HOME, "learn-kjv"))
    ap.add_argument("--json-out", help="add the runs to this file (same label and seed replaced)")
    ap.add_argument("--table", action="store_true", help="only print --json-out's table")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.config, args.data_dir, args.seeds[0], args.steps,
                                args.overrides)))
        return 0
    kept = []
    if args.json_out and os.path.exists(args.json_out):
        with open(args.json_out) as fh:
            kept = json.load(fh)["runs"]
    if not args.table:
        paths = prepare_text(args.data_dir)
        for seed in args.seeds:
            for system in args.systems:
                if system == "bilm-tf":
                    run = run_bilm_tf(args.config, paths, seed, args.steps)
                    run["label"] = "bilm-tf"
                else:
                    run = run_elmo_jax(args.config, paths, seed, args.steps, args.overrides)
                    run["label"] = args.label or "elmo-jax"
                run.update(config=args.config, **_common.machine())
                kept = [r for r in kept if (r["label"], r["seed"]) != (run["label"], seed)]
                kept.append(run)
                print(f"[learn] {run['label']} seed {seed}: "
                      + ", ".join(f"{x['step']}: {x['ppl_forward']:,.1f} / {x['ppl_backward']:,.1f}"
                                  for x in run["results"]), file=sys.stderr, flush=True)
                _common.write_json(args.json_out, {"runs": kept})
    print(table(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
