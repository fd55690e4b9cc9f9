"""Downstream tasks on small data made here: the tagger (embed inside its jitted
step, the biLM frozen or fine-tuned) and the word-sense probe."""
import json
import os

import jax
import numpy as np
import pytest

import elmo_jax
from conftest import FIXTURES, grammar_sentences
from elmo_jax.tasks import pos, wsd

pytestmark = pytest.mark.e2e  # trains taggers

TAGS = {"the": "DET", "in": "ADP", ".": "."}
ADJ = {"big", "small", "old", "young", "happy"}
VERBS = {"sees", "see", "likes", "like", "chases", "chase", "helps", "help"}


def tagged(n, seed):
    out = []
    for s in grammar_sentences(n, seed):
        out.append((s, [TAGS.get(w, "ADJ" if w in ADJ else "VERB" if w in VERBS else "NOUN")
                        for w in s]))
    return out


@pytest.fixture(scope="module")
def fixture_model():
    options = elmo_jax.ElmoOptions.from_json(os.path.join(FIXTURES, "options.json"))
    return options, elmo_jax.load_weights(os.path.join(FIXTURES, "lm_weights.hdf5"), options)


@pytest.mark.parametrize("mode", ["mix", "random", "random+mix"])
def test_tagger_learns_and_keeps_the_bilm_frozen(fixture_model, mode):
    options, bilm = fixture_model
    config = pos.TaggerConfig(mode=mode, epochs=15, batch_size=16, learning_rate=0.1,
                              dropout=0.0)
    result, params = pos.train_and_evaluate(bilm, options, tagged(200, 0), tagged(40, 1),
                                            tagged(60, 2), config, return_params=True)
    assert result["test_accuracy"] > 0.9, result
    for a, b in zip(jax.tree.leaves(bilm), jax.tree.leaves(params["bilm"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if "mix" in mode:
        assert abs(sum(result["mix_weights"]) - 1) < 1e-2 and len(result["mix_weights"]) == 3


def test_fine_tuning_moves_the_bilm(fixture_model):
    options, bilm = fixture_model
    config = pos.TaggerConfig(mode="top", epochs=1, batch_size=16, fine_tune=True,
                              bilm_learning_rate=1e-3)
    _, params = pos.train_and_evaluate(bilm, options, tagged(40, 0), tagged(10, 1),
                                       tagged(10, 2), config, return_params=True)
    moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(bilm), jax.tree.leaves(params["bilm"]))]
    assert max(moved) > 1e-4


def _example(sense, number, text, lemma="bank"):
    tokens = text.split()
    return {"lemma": lemma, "pos": "noun", "sense_key": sense, "sense_number": number,
            "tokens": tokens, "target": tokens.index(lemma)}


def test_word_sense_probe(fixture_model):
    options, bilm = fixture_model
    elmo = elmo_jax.Elmo(bilm, options)
    river = "we sat on the bank of the river"
    money = "the bank raised its interest rates today"
    examples = ([_example("bank%1", 2, river)] * 3 + [_example("bank%2", 1, money)] * 2
                + [_example("bank%3", 3, "a bank")]  # a sense seen once: not scored
                + [_example("solo%1", 1, "a solo", "solo")])  # one sense: not polysemous
    result = wsd.probe(elmo, examples)
    assert (result["lemmas"], result["examples"], result["scored_examples"]) == (1, 6, 5)
    # identical contexts are nearest neighbours from layer 1 on; at layer 0 every
    # "bank" has the same vector and the first other example (a river one) wins
    assert result["accuracy_by_layer"][1:] == [1.0, 1.0]
    assert result["accuracy_by_layer"][0] == pytest.approx(3 / 5)
    assert result["first_sense_accuracy"] == pytest.approx(2 / 5)


def test_most_frequent_tag_baseline():
    train = [(["the", "run", "run"], ["DET", "NOUN", "VERB"]), (["run"], ["VERB"])]
    test = [(["run", "the", "walk"], ["VERB", "DET", "VERB"])]
    r = pos.most_frequent_tag_accuracy(train, test)
    assert r == {"test_accuracy": round(2 / 3, 4), "unseen_word_rate": round(1 / 3, 4)}


def test_the_tagger_trains_from_a_store_as_on_the_fly(fixture_model, tmp_path, monkeypatch):
    """Stored layers (embedded once by the corpus job) train the same tagger
    to the same accuracy as the biLM run in every step, and no epoch runs
    the biLM."""
    options, bilm = fixture_model
    splits = {"train": tagged(120, 0), "dev": tagged(30, 1), "test": tagged(40, 2)}
    config = pos.TaggerConfig(mode="mix", epochs=6, batch_size=16, learning_rate=0.1,
                              dropout=0.0)
    on_the_fly = pos.train_and_evaluate(bilm, options, *splits.values(), config)
    features = pos.features_for(splits, str(tmp_path / "features"), bilm, options)
    assert [len(features[k]) for k in splits] == [120, 30, 40]

    def no_bilm(*a, **k):
        raise AssertionError("the biLM ran")

    monkeypatch.setattr(pos, "embed", no_bilm)
    monkeypatch.setattr(pos.ElmoEmbedder, "__call__", no_bilm)
    stored = pos.train_and_evaluate(bilm, options, *splits.values(), config, features=features)
    assert stored["test_accuracy"] > 0.8
    assert abs(stored["test_accuracy"] - on_the_fly["test_accuracy"]) <= 0.01, (stored,
                                                                                 on_the_fly)
    assert stored["mix_weights"] == pytest.approx(on_the_fly["mix_weights"], abs=0.01)


def test_stored_features_and_the_result_line_go_to_a_bucket(fixture_model, tmp_path,
                                                            gs_bucket):
    """`--features gs://...` stores the splits' layers in the bucket as the
    local folder holds them; `--out gs://...` gains one line per result."""
    from elmo_jax.storage import paths
    from elmo_jax.storage.files import append_line

    options, bilm = fixture_model
    splits = {"train": tagged(12, 0), "test": tagged(5, 2)}
    local = pos.features_for(splits, str(tmp_path / "features"), bilm, options)
    remote = pos.features_for(splits, f"{gs_bucket}/features", bilm, options)
    for name in splits:
        assert len(remote[name]) == len(local[name])
        for i in range(len(local[name])):
            np.testing.assert_array_equal(remote[name][i], local[name][i])
    for step in range(2):
        append_line(f"{gs_bucket}/results.jsonl", json.dumps({"step": step}))
    assert paths.read_text(f"{gs_bucket}/results.jsonl") == '{"step": 0}\n{"step": 1}\n'

