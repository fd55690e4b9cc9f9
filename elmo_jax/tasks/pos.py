"""A part-of-speech tagger on top of ELMo, with `embed` inside the jitted train step.

The tagger (a linear layer, or a small biLSTM with `hidden > 0`) reads one of:
    mix     the learned scalar mix of all biLM layers (AllenNLP's ELMo)
    layer0  the context-independent token layer only
    top     the top LSTM layer only
    random  randomly initialised, trained word embeddings of the same width
            (the baseline without ELMo)
    random+mix  those word embeddings concatenated with the scalar mix: ELMo
            added to the baseline's input, as the paper uses it
ELMo comes in as `elmo_jax.api.flax_modules.ElmoEmbedder`, a linen module whose mix is
an ordinary parameter. The biLM is frozen by default (its own collection, no
gradient): gradients reach only the mix and the tagger; `fine_tune=True` also
trains the biLM (at `bilm_learning_rate`).

    python -m elmo_jax.tasks.pos --weights runs/x/export --pos_dir CACHE/brown/pos --mode mix
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time

if __name__ == "__main__":  # huge pages, set before JAX loads (elmo_jax/cli/huge_pages.py)
    from elmo_jax.cli.huge_pages import reexec_with_huge_pages

    reexec_with_huge_pages()

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.storage import paths
from elmo_jax.core.chars import batch_to_char_ids, trim_padding
from elmo_jax.core.embedding import embed
from elmo_jax.errors import MissingFile
from elmo_jax.storage.files import append_line
from elmo_jax.api.flax_modules import ElmoEmbedder, init_variables
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.batching import next_power_of_two
from elmo_jax.formats.stored_model import open_model

MODES = ("mix", "layer0", "top", "random", "random+mix")


@dataclasses.dataclass(frozen=True)
class TaggerConfig:
    mode: str = "mix"
    hidden: int = 0                 # 0: a linear tagger; > 0: a biLSTM of this width first
    epochs: int = 3
    batch_size: int = 64
    learning_rate: float = 2e-3
    dropout: float = 0.2
    fine_tune: bool = False
    bilm_learning_rate: float = 1e-4
    max_train_sentences: int | None = None
    seed: int = 0


def load_split(pos_dir: str, split: str) -> list[tuple[list[str], list[str]]]:
    """(tokens, universal tags) of each sentence of a `brown` recipe split."""
    path = os.path.join(pos_dir, f"{split}.jsonl")
    if not os.path.exists(path):
        raise MissingFile(f"{path} is missing: run `python -m elmo_jax.data.recipes brown`")
    with open(path, encoding="utf-8") as fh:
        return [(r["tokens"], r["upos"]) for r in map(json.loads, fh)]


def most_frequent_tag_accuracy(train, test, unknown: str = "NOUN") -> dict:
    """The classic baseline: each word's most frequent training tag (`unknown`
    for unseen words). Returns test accuracy and the unseen-word rate."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for tokens, tags in train:
        for w, t in zip(tokens, tags):
            counts[w][t] += 1
    best = {w: c.most_common(1)[0][0] for w, c in counts.items()}
    pairs = [(w, t) for tokens, tags in test for w, t in zip(tokens, tags)]
    right = sum(best.get(w, unknown) == t for w, t in pairs)
    return {"test_accuracy": round(right / len(pairs), 4),
            "unseen_word_rate": round(sum(w not in best for w, _ in pairs) / len(pairs), 4)}


class Tagger(nn.Module):
    """Representations [B, T, W] -> tag scores [B, T, n_tags]."""
    n_tags: int
    hidden: int = 0
    dropout: float = 0.2

    @nn.compact
    def __call__(self, x, mask, deterministic: bool = True):
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        if self.hidden:
            lengths = jnp.sum(mask, axis=1)
            x = nn.Bidirectional(nn.RNN(nn.LSTMCell(self.hidden)),
                                 nn.RNN(nn.LSTMCell(self.hidden)))(x, seq_lengths=lengths)
            x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        return nn.Dense(self.n_tags)(x)


def make_batches(data, tag_index, word_index, batch_size, max_chars=50, widest_filter=0,
                 lexicon=None, layers=None):
    """Length-sorted batches of numpy arrays; lengths padded to powers of two
    and every batch to `batch_size` rows, so that few shapes are compiled.
    `widest_filter` (the biLM's, when > 0) cuts each batch's spellings to what
    the character CNN needs (`chars.trim_padding`: the same features). A
    `lexicon` (an ELMoForManyLangs model's) spells the tokens instead. With
    `layers` (an embedding store of `data`'s sentences, `store.py`: entry i
    [L+1, n_i, 2P]) a batch carries the stored layers [B, T, L+1, 2P] instead
    of character ids, and the biLM is never run."""
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = [data[i] for i in order[start:start + batch_size]]
        T = next_power_of_two(max(len(t) for t, _ in rows))
        sents = [t for t, _ in rows] + [[]] * (batch_size - len(rows))
        tags = np.zeros((batch_size, T), np.int32)
        words = np.zeros((batch_size, T), np.int32)
        for b, (tokens, tg) in enumerate(rows):
            tags[b, :len(tg)] = [tag_index[t] for t in tg]
            words[b, :len(tokens)] = [word_index.get(w, 1) for w in tokens]
        mask = np.arange(T)[None, :] < np.array([len(s) for s in sents])[:, None]
        batch = {"tags": tags, "word_ids": words, "mask": mask}
        if layers is not None:
            batch["layers"] = _stored_layers(layers, order[start:start + batch_size], rows,
                                             batch_size, T)
        else:
            if lexicon is not None:
                char_ids = lexicon.batch_ids(sents, max_chars, min_length=T)
            else:
                char_ids = batch_to_char_ids(sents, max_chars, min_length=T)
            if widest_filter and lexicon is None:
                char_ids = trim_padding(char_ids, widest_filter)
            batch["char_ids"] = char_ids
        batches.append(batch)
    return batches


def _stored_layers(layers, indices, rows, batch_size: int, T: int) -> np.ndarray:
    """[B, T, L+1, 2P] float32: the stored layers of the sentences `indices`."""
    first = np.asarray(layers[indices[0]])
    out = np.zeros((batch_size, T, first.shape[0], first.shape[-1]), np.float32)
    for b, (i, (tokens, _)) in enumerate(zip(indices, rows)):
        x = np.asarray(layers[i])
        if x.shape[1] != len(tokens):
            raise ValueError(f"the stored features of sentence {i} have {x.shape[1]} tokens, "
                             f"the sentence {len(tokens)}: the store is of another text")
        out[b, :len(tokens)] = np.moveaxis(x, 0, 1)
    return out


def _elmo_variables(elmo: ElmoEmbedder, mix: dict, bilm: dict) -> dict:
    """The module's variables: the mix as its params, the biLM in its own
    collection (or among the params when fine-tuned)."""
    if elmo.fine_tune:
        return {"params": {**mix, "bilm": bilm}}
    return {"params": mix, "bilm": {"weights": bilm}}


def _features(elmo: ElmoEmbedder, trainable, bilm, batch, mode):
    """The tagger's input [B, T, 2P] (random+mix: [B, T, 4P]) for one batch:
    from the biLM run here, or from its stored layers (batch["layers"])."""
    if "layers" in batch:
        return _stored_features(trainable, batch, mode)
    if mode in ("layer0", "top"):
        out = embed(bilm, batch["char_ids"], elmo.options)
        return out.layers[0 if mode == "layer0" else -1]
    parts = []
    if "random" in mode:
        parts.append(trainable["embed"][batch["word_ids"]])
    if "mix" in mode:
        (mixed,), _ = elmo.apply(_elmo_variables(elmo, trainable["mix"], bilm), batch["char_ids"])
        parts.append(mixed)
    return jnp.concatenate(parts, axis=-1)


def _stored_features(trainable, batch, mode):
    """`_features` from stored layers [B, T, L+1, 2P]: the same scalar mix
    (gamma * softmax-weighted sum) as `ElmoEmbedder`'s, without the biLM."""
    layers = batch["layers"]
    if mode in ("layer0", "top"):
        return layers[:, :, 0 if mode == "layer0" else -1]
    parts = []
    if "random" in mode:
        parts.append(trainable["embed"][batch["word_ids"]])
    if "mix" in mode:
        mix = trainable["mix"]
        w = jax.nn.softmax(mix["scalar_mix_weights"][0])
        parts.append(mix["gamma"][0] * jnp.einsum("k,btkw->btw", w, layers))
    return jnp.concatenate(parts, axis=-1)


def _init_trainable(config: TaggerConfig, elmo: ElmoEmbedder, bilm: dict, tagger: Tagger,
                    n_words: int, key: jax.Array, stored: bool = False) -> dict:
    """The tagger's parameters, the mix (modes with "mix"), word embeddings ("random")."""
    W = elmo.options.output_dim
    width = 2 * W if config.mode == "random+mix" else W
    trainable = {"tagger": tagger.init(key, jnp.zeros((1, 8, width)),
                                       jnp.ones((1, 8), bool))["params"]}
    if "mix" in config.mode and stored:  # ElmoEmbedder's initial mix, without the biLM
        K = elmo.options.n_output_layers
        trainable["mix"] = {"scalar_mix_weights": jnp.zeros((1, K)), "gamma": jnp.ones((1,))}
    elif "mix" in config.mode:
        ids = elmo.char_ids([["a"]])
        mix = init_variables(elmo, key, ids, bilm)["params"]
        trainable["mix"] = {k: v for k, v in mix.items() if k != "bilm"}
    if "random" in config.mode:
        trainable["embed"] = 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (n_words, W))
    return trainable


def _make_steps(tagger: Tagger, tx, elmo: ElmoEmbedder, config: TaggerConfig):
    """(train_step, predict), jitted, with ELMo inside both."""

    def loss_fn(params, batch, rng):
        x = _features(elmo, params["trainable"], params["bilm"] if config.fine_tune
                      else jax.lax.stop_gradient(params["bilm"]), batch, config.mode)
        logits = tagger.apply({"params": params["trainable"]["tagger"]}, x, batch["mask"],
                              deterministic=False, rngs={"dropout": rng})
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["tags"])
        m = batch["mask"].astype(jnp.float32)
        return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)

    @jax.jit
    def train_step(params, opt_state, batch, rng):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def predict(params, batch):
        x = _features(elmo, params["trainable"], params["bilm"], batch, config.mode)
        logits = tagger.apply({"params": params["trainable"]["tagger"]}, x, batch["mask"])
        return jnp.argmax(logits, -1)

    return train_step, predict


def _accuracy(predict, params, batches) -> float:
    right = total = 0
    for batch in batches:
        pred = np.asarray(predict(params, batch))
        m = batch["mask"]
        right += int(np.sum((pred == batch["tags"]) & m))
        total += int(m.sum())
    return right / total


def train_and_evaluate(bilm: dict, options: ElmoOptions, train, dev, test,
                       config: TaggerConfig, progress: bool = False,
                       return_params: bool = False, lexicon=None, features=None):
    """Train a tagger on `train`, pick the epoch by dev accuracy, report test
    accuracy (and, with `return_params`, the chosen parameters). `features`
    ({"train", "dev", "test"}: embedding stores of the splits' sentences,
    `features_for`) trains on stored layers: no epoch runs the biLM."""
    if config.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {config.mode!r}")
    if features is not None and config.fine_tune:
        raise ValueError("stored features come from a frozen biLM: fine-tuning needs the "
                         "biLM run in the step (drop --features)")
    if config.max_train_sentences:
        train = train[:config.max_train_sentences]
    tags = sorted({t for _, tg in train for t in tg} | {t for _, tg in dev + test for t in tg})
    tag_index = {t: i for i, t in enumerate(tags)}
    words = sorted({w for s, _ in train for w in s})
    word_index = {w: i + 2 for i, w in enumerate(words)}  # 0 padding, 1 unknown
    C = options.char_cnn.max_characters_per_token
    batches = {name: make_batches(d, tag_index, word_index, config.batch_size, C,
                                 options.char_cnn.widest_filter, lexicon,
                                 None if features is None else features[name])
               for name, d in (("train", train), ("dev", dev), ("test", test))}
    tagger = Tagger(len(tags), config.hidden, config.dropout)
    key = jax.random.PRNGKey(config.seed)
    elmo = ElmoEmbedder(options, dropout=0.0, fine_tune=config.fine_tune)
    bilm = jax.tree.map(jnp.asarray, bilm)
    trainable = _init_trainable(config, elmo, bilm, tagger, len(words) + 2, key,
                                stored=features is not None)
    params = {"trainable": trainable, "bilm": bilm}
    tx = optax.multi_transform(
        {"trainable": optax.adam(config.learning_rate),
         "bilm": optax.adam(config.bilm_learning_rate) if config.fine_tune
         else optax.set_to_zero()},
        {"trainable": "trainable", "bilm": "bilm"})
    opt_state = tx.init(params)
    train_step, predict = _make_steps(tagger, tx, elmo, config)
    rng = np.random.default_rng(config.seed)
    t0 = time.time()
    best = {"dev_accuracy": -1.0}
    step = 0
    for epoch in range(1, config.epochs + 1):
        losses = []
        for b in rng.permutation(len(batches["train"])):
            params, opt_state, loss = train_step(params, opt_state, batches["train"][b],
                                                 jax.random.fold_in(key, step))
            losses.append(float(loss))
            step += 1
        dev_acc = _accuracy(predict, params, batches["dev"])
        if progress:
            print(f"[pos {config.mode}] epoch {epoch}: train loss {np.mean(losses):.4f}, "
                  f"dev accuracy {dev_acc:.4f}", file=sys.stderr, flush=True)
        if dev_acc > best["dev_accuracy"]:
            best = {"dev_accuracy": dev_acc, "epoch": epoch, "params": params}
    result = {"mode": config.mode, "hidden": config.hidden, "fine_tune": config.fine_tune,
              "epochs": config.epochs, "best_epoch": best["epoch"],
              "dev_accuracy": round(best["dev_accuracy"], 4),
              "test_accuracy": round(_accuracy(predict, best["params"], batches["test"]), 4),
              "train_sentences": len(train), "test_tokens": sum(len(t) for t, _ in test),
              "n_tags": len(tags), "train_seconds": round(time.time() - t0, 1)}
    if "mix" in trainable:
        mix = best["params"]["trainable"]["mix"]
        result["mix_weights"] = [round(float(x), 3)
                                 for x in jax.nn.softmax(mix["scalar_mix_weights"][0])]
        result["mix_gamma"] = round(float(mix["gamma"][0]), 3)
    return (result, best["params"]) if return_params else result


def features_for(splits: dict, directory: str, bilm: dict, options: ElmoOptions,
                 lexicon=None, progress: bool = False) -> dict:
    """{split: embedding store of its sentences (all layers)}, in
    `directory/split`: embedded once by the corpus job (`corpus.py`), reused
    by every later run while the model and the sentences are the same."""
    from elmo_jax.corpus import CorpusSettings, embed_corpus
    from elmo_jax.storage.files import write_text
    from elmo_jax.corpus.store import open_embeddings

    import hashlib

    paths.makedirs(directory)
    out = {}
    for name, data in splits.items():
        for tokens, _ in data:
            if any(t.split() != [t] for t in tokens):
                raise ValueError(f"a {name} token holds whitespace: {tokens!r}")
        lines = "".join(" ".join(t) + "\n" for t, _ in data)
        # named by content: other sentences (another --max_train_sentences) get their own
        key = f"{name}-{hashlib.sha256(lines.encode()).hexdigest()[:12]}"
        text = paths.join(directory, f"{key}.txt")
        if not paths.exists(text):
            write_text(text, lines)
        embed_corpus(bilm, options, [text], paths.join(directory, key), CorpusSettings(),
                     lexicon=lexicon, progress=progress)
        out[name] = open_embeddings(paths.join(directory, key))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="a stored model: an export folder "
                    "(train.py export), a workdir, an ELMoForManyLangs folder, a registry name")
    ap.add_argument("--pos_dir", required=True, help="the brown (or peoples-daily) recipe's "
                                                     "pos/ directory")
    ap.add_argument("--mode", choices=MODES, default="mix")
    ap.add_argument("--hidden", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--learning_rate", type=float, default=2e-3)
    ap.add_argument("--fine_tune", action="store_true", help="also train the biLM")
    ap.add_argument("--max_train_sentences", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", metavar="DIR", help="train on stored layers: the splits "
                    "are embedded once into stores in DIR (reused while the model and "
                    "sentences are the same), and no epoch runs the biLM")
    ap.add_argument("--out", help="append the result as a JSON line to this file")
    args = ap.parse_args(argv)
    for p in (args.features, args.out):
        if p:
            paths.check(p)  # a bad path is one line before the model is read
    model = open_model(args.weights)
    options, bilm = model.options, model.params
    config = TaggerConfig(mode=args.mode, hidden=args.hidden, epochs=args.epochs,
                          batch_size=args.batch_size, learning_rate=args.learning_rate,
                          fine_tune=args.fine_tune, max_train_sentences=args.max_train_sentences,
                          seed=args.seed)
    splits = [load_split(args.pos_dir, s) for s in ("train", "dev", "test")]
    if args.max_train_sentences:
        splits[0] = splits[0][:args.max_train_sentences]
    features = None
    if args.features:
        features = features_for(dict(zip(("train", "dev", "test"), splits)), args.features,
                                bilm, options, model.lexicon, progress=True)
    result = {"weights": args.weights, **train_and_evaluate(bilm, options, *splits, config,
                                                            progress=True,
                                                            lexicon=model.lexicon,
                                                            features=features)}
    line = json.dumps(result)
    if args.out:
        append_line(args.out, line)
    print(line)


if __name__ == "__main__":
    from elmo_jax.cli.process import run_cli

    run_cli(main)
