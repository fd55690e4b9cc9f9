"""A word-sense probe in the manner of the ELMo paper (section 5.3): a 1-nearest-
neighbour sense classifier over the contextual vectors of a target word.

Data: WordNet's usage examples with their sense keys (the `wordnet` recipe).
For each polysemous lemma, every usage example is held out in turn and labelled
with the sense of its nearest (cosine) other example of the same lemma, per
biLM layer. Only examples whose sense has another example can be right, so only
those are scored. Baseline: WordNet's first sense (its most frequent one) of
the lemma, among the senses that have examples.

    python -m elmo_jax.tasks.wsd --weights runs/x/export --examples CACHE/wordnet/examples.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import os

if __name__ == "__main__":  # huge pages, set before JAX loads (elmo_jax/cli/huge_pages.py)
    from elmo_jax.cli.huge_pages import reexec_with_huge_pages

    reexec_with_huge_pages()

import numpy as np

from elmo_jax.api.elmo import Elmo
from elmo_jax.errors import MissingFile
from elmo_jax.storage.files import append_line


def load_examples(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise MissingFile(f"{path} is missing: run `python -m elmo_jax.data.recipes wordnet`")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def polysemous_groups(examples: list[dict], min_senses: int = 2) -> dict[tuple, list[dict]]:
    """(lemma, pos) -> its examples, for lemmas whose examples show at least
    `min_senses` senses, one of them at least twice (else nothing can be scored)."""
    groups = collections.defaultdict(list)
    for e in examples:
        groups[(e["lemma"], e["pos"])].append(e)
    keep = {}
    for key, exs in groups.items():
        counts = collections.Counter(e["sense_key"] for e in exs)
        if len(counts) >= min_senses and max(counts.values()) >= 2:
            keep[key] = exs
    return keep


def probe(elmo: Elmo, examples: list[dict], batch_size: int = 64) -> dict:
    """Leave-one-out 1-NN sense accuracy per layer, and the first-sense baseline."""
    groups = polysemous_groups(examples)
    flat = [e for exs in groups.values() for e in exs]
    layers = elmo.embed_sentences([e["tokens"] for e in flat], batch_size=batch_size)
    vectors = np.stack([a[:, e["target"]] for a, e in zip(layers, flat)])  # [n, L+1, 2P]
    vectors /= np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    K = vectors.shape[1]
    right, scored, first_sense = np.zeros(K), 0, 0
    start = 0
    for exs in groups.values():
        idx = np.arange(start, start + len(exs))
        start += len(exs)
        senses = np.array([e["sense_key"] for e in exs])
        counts = collections.Counter(senses)
        first = min(exs, key=lambda e: e["sense_number"])["sense_key"]
        for j in range(len(exs)):
            if counts[senses[j]] < 2:
                continue
            scored += 1
            first_sense += senses[j] == first
            for k in range(K):
                sims = vectors[idx, k] @ vectors[idx[j], k]
                sims[j] = -np.inf
                right[k] += senses[int(np.argmax(sims))] == senses[j]
    return {"lemmas": len(groups), "examples": len(flat), "scored_examples": scored,
            "accuracy_by_layer": [round(float(r / scored), 4) for r in right],
            "first_sense_accuracy": round(first_sense / scored, 4)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="directory with options.json, weights.hdf5")
    ap.add_argument("--examples", required=True, help="the wordnet recipe's examples.jsonl")
    ap.add_argument("--out", help="append the result as a JSON line to this file")
    args = ap.parse_args(argv)
    elmo = Elmo.from_pretrained(args.weights)
    result = {"weights": args.weights, **probe(elmo, load_examples(args.examples))}
    line = json.dumps(result)
    if args.out:
        append_line(args.out, line)
    print(line)


if __name__ == "__main__":
    from elmo_jax.cli.process import run_cli

    run_cli(main)
