"""What the demos share (demo.py for English, demo_zh.py for Chinese): the
section headers, the vocabulary, the bounded training run, the training curve."""
from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def section(title):
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def write_vocab(train_glob, workdir):
    """The 20,000 most frequent training words (and the specials) -> WORKDIR/vocab.txt."""
    from elmo_jax.data import vocab_from_files

    vocab, stats = vocab_from_files(train_glob, max_vocab=20000)
    vocab_file = os.path.join(workdir, "vocab.txt")
    vocab.to_file(vocab_file)
    print(f"vocabulary: {len(vocab)} entries, {stats['tokens']} training tokens")
    return vocab_file


def train(train_glob, vocab_file, workdir, minutes):
    from elmo_jax import training
    from elmo_jax.config import load_config

    section(f"training the tiny config for {minutes:g} minutes")
    config = load_config(os.path.join(HERE, "configs", "tiny.json"), [
        f"data.train_files={json.dumps(train_glob)}", f"data.vocab_file={json.dumps(vocab_file)}",
        f"train.max_seconds={60 * minutes}", "train.log_every=50", "train.checkpoint_every=500"])
    last = training.train_and_evaluate(config, os.path.join(workdir, "run"))
    print(f"stopped after {last['step']} steps; last train loss {last.get('train_loss', 0):.3f}")
    return last


def plot_curve(workdir, out_png, ppl, title):
    """Training perplexity by step (log scale) with the held-out points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elmo_jax.training.workdir import read_metrics

    rows = read_metrics(os.path.join(workdir, "run"))  # a resumed run's steps once
    train = [(r["step"], r["train_ppl"]) for r in rows if "train_ppl" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*zip(*train), label="training (sampled softmax)")
    for name, r in ppl.items():
        ax.scatter([r["step"]], [r["eval_ppl"]], zorder=3, label=f"held out: {name} (full softmax)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
