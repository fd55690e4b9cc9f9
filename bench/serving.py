"""The SavedModel against elmo-jax itself, side by side (issue 63).

    python -m bench.serving --config allennlp-small [--repeats 3]
    python -m bench.serving --config original --repeats 3

Random weights for the config's model (`init_params`, seed 0) are exported
once as bilm-tf's files and as a SavedModel (`export_model`). Then, alternately
in separate processes, each after waiting for a quiet machine: elmo-jax's
`Elmo.embed_sentences` (the Python spelling, then `embed`; all layers) and the
SavedModel's `default` signature called from TensorFlow on CPU (the spelling in
TF ops, the biLM's XlaCallModule, the mix), on the same 30 sentences (744
tokens, the bilm-tf fixture's) in one batch: 1 warm-up call, then 5 timed ones.
A third side, `embed` on the batch padded as the SavedModel pads it (no
packing by length), is what the SavedModel's program computes. Reported:
tokens/s (median over repeats, spread), the load time and the first call's
time, the artifact's size against the hdf5's, `ratio_vs_elmo_jax` (the
SavedModel's tokens/s over `Elmo.embed_sentences`'; goal >= 0.9) and
`ratio_vs_embed`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bench import _common

SENTENCES = os.path.join(_common.REPO, "tests", "fixtures", "bilm-tf",
                         "lm_embeddings_sentences.json")
REPS = 5


def sentences() -> list[list[str]]:
    with open(SENTENCES, encoding="utf-8") as fh:
        return [sentence.split() for batch in json.load(fh) for sentence in batch]


def make_artifacts(config: str, folder: str) -> dict:
    """bilm-tf's files and the SavedModel of random weights for `config`."""
    import jax

    from elmo_jax import export_model, init_params, save_export

    options = _common.load_config(config).model
    export = os.path.join(folder, "export")
    save_export(export, init_params(options, jax.random.key(0)), options)
    t0 = time.perf_counter()
    export_model(export, os.path.join(folder, "savedmodel"), "savedmodel")
    return {"export_s": round(time.perf_counter() - t0, 1),
            "hdf5_mib": round(os.path.getsize(os.path.join(export, "weights.hdf5")) / 2**20, 1),
            "savedmodel_mib": round(sum(os.path.getsize(os.path.join(r, n))
                                        for r, _, names in os.walk(os.path.join(folder, "savedmodel"))
                                        for n in names) / 2**20, 1)}


def child_elmo_jax(folder: str) -> dict:
    _common.run_as_the_commands()
    from elmo_jax import Elmo

    t0 = time.perf_counter()
    elmo = Elmo.from_pretrained(os.path.join(folder, "export"))
    load = time.perf_counter() - t0
    batch = sentences()
    t0 = time.perf_counter()
    elmo.embed_sentences(batch, batch_size=len(batch))
    first = time.perf_counter() - t0
    times = _common.call_times(lambda: elmo.embed_sentences(batch, batch_size=len(batch)),
                               n=REPS, warmup=False)
    return {"load_s": load, "first_call_s": first, "times": times,
            "tokens": sum(len(s) for s in batch)}


def child_embed(folder: str) -> dict:
    """`embed` on the batch padded as the SavedModel pads it (no packing by
    length, all 50 characters): what the SavedModel's program computes."""
    _common.run_as_the_commands()
    import jax

    from elmo_jax import batch_to_char_ids, embed, open_model

    t0 = time.perf_counter()
    model = open_model(os.path.join(folder, "export"))
    load = time.perf_counter() - t0
    batch = sentences()
    run = lambda: embed(model.params, batch_to_char_ids(batch), model.options).layers
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    first = time.perf_counter() - t0
    times = _common.call_times(run, n=REPS, warmup=False)
    return {"load_s": load, "first_call_s": first, "times": times,
            "tokens": sum(len(s) for s in batch)}


def child_savedmodel(folder: str) -> dict:
    import tensorflow as tf

    t0 = time.perf_counter()
    model = tf.saved_model.load(os.path.join(folder, "savedmodel"))
    load = time.perf_counter() - t0
    batch = sentences()
    text = tf.constant([" ".join(s) for s in batch])
    signature = model.signatures["default"]
    t0 = time.perf_counter()
    signature(text)["elmo"].numpy()
    first = time.perf_counter() - t0
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        signature(text)["elmo"].numpy()
        times.append(time.perf_counter() - t0)
    return {"load_s": load, "first_call_s": first, "times": times,
            "tokens": sum(len(s) for s in batch)}


CHILDREN = {"elmo-jax": child_elmo_jax, "embed": child_embed, "savedmodel": child_savedmodel}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="allennlp-small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json_out")
    ap.add_argument("--child", choices=list(CHILDREN))
    ap.add_argument("--folder")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](args.folder)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as folder:
        sizes = make_artifacts(args.config, folder)
        runs: dict[str, list[dict]] = {side: [] for side in CHILDREN}
        for _ in range(args.repeats):
            for side in runs:
                _common.wait_quiet()
                runs[side].append(_common.run_child(
                    [sys.executable, "-m", "bench.serving", "--child", side, "--folder", folder]))
    summary = {"bench": "serving", "config": args.config, **_common.machine(), **sizes}
    for side, results in runs.items():
        rates = [r["tokens"] / statistics.median(r["times"]) for r in results]
        summary[side] = {"tokens_per_s": round(statistics.median(rates)),
                         "spread": _common.spread(rates),
                         "load_s": round(statistics.median(r["load_s"] for r in results), 2),
                         "first_call_s": round(statistics.median(r["first_call_s"]
                                                                 for r in results), 2),
                         "peak_rss_mib": max(r["peak_rss_mib_measured"] for r in results)}
        print(f"{side:>10}: {summary[side]['tokens_per_s']:>7} tokens/s "
              f"(spread {summary[side]['spread']}), load {summary[side]['load_s']} s, "
              f"first call {summary[side]['first_call_s']} s")
    summary["ratio_vs_elmo_jax"] = round(summary["savedmodel"]["tokens_per_s"]
                                         / summary["elmo-jax"]["tokens_per_s"], 3)
    summary["ratio_vs_embed"] = round(summary["savedmodel"]["tokens_per_s"]
                                      / summary["embed"]["tokens_per_s"], 3)
    print(json.dumps(summary))
    _common.write_json(args.json_out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
