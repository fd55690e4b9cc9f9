"""What bf16 matmuls cost in accuracy: every layer of the biLM in bf16 (f32
accumulation, f32 cell state) against f32, on the bilm-tf fixture's sentences.

    python -m bench.bf16_accuracy [--config original ...]

The fixture model (tests/fixtures/bilm-tf) always; each `--config` adds the
random-weight model the embed benchmark uses for it (made by the AllenNLP
peer's make_weights.py: run bench/embed.py --config NAME once first). Prints
per model and layer the max absolute difference, the max relative to the
layer's largest f32 magnitude, and the mean relative error, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from bench import _common
from bench import embed as bench_embed

FIXTURE = os.path.join(_common.REPO, "tests", "fixtures", "bilm-tf")


def layer_errors(options_file: str, weights_file: str, sentences) -> list[dict]:
    import jax.numpy as jnp

    import elmo_jax

    f32 = elmo_jax.Elmo.from_files(options_file, weights_file)
    bf16 = elmo_jax.Elmo.from_files(options_file, weights_file, dtype=jnp.bfloat16)
    a = np.concatenate(f32.embed_sentences(sentences, batch_size=32), axis=1)   # [L+1, n, 2P]
    b = np.concatenate(bf16.embed_sentences(sentences, batch_size=32), axis=1)
    out = []
    for k in range(a.shape[0]):
        diff = np.abs(a[k].astype(np.float64) - b[k])
        scale = np.abs(a[k]).max()
        out.append({"layer": k, "max_abs": float(diff.max()), "max_rel": float(diff.max() / scale),
                    "mean_rel": float(diff.mean() / np.abs(a[k]).mean())})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="*", default=[], help="configs with bench weights")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    with open(os.path.join(FIXTURE, "lm_embeddings_sentences.json")) as fh:
        sentences = [line.split() for group in json.load(fh) for line in group]
    models = {"bilm-tf fixture": (os.path.join(FIXTURE, "options.json"),
                                  os.path.join(FIXTURE, "lm_weights.hdf5"))}
    for name in args.config:
        models[name] = bench_embed.weights_for(name)
    result = {"benchmark": "bf16_accuracy", **_common.machine(), "models": {}}
    for name, (o, w) in models.items():
        errs = layer_errors(o, w, sentences)
        result["models"][name] = errs
        for e in errs:
            print(f"{name:16s} layer {e['layer']}: max abs {e['max_abs']:.2e}, max rel "
                  f"{e['max_rel']:.2e}, mean rel {e['mean_rel']:.2e}")
    _common.write_json(args.json_out, result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
