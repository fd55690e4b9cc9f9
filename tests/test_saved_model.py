"""The TF2 SavedModel (`export_model(..., format="savedmodel")`): every output of
TF-Hub ELMo's signatures equals `embed` and the mix, on the bilm-tf fixture, on
the ELMoForManyLangs fixture with Chinese text, and on a model `train.py` trains
here; the spelling in TF ops equals `batch_to_char_ids`; TF-Hub's calls load it
and Keras trains its mix (and its biLM, when asked); `saved_model_cli` runs it
where elmo_jax and jax cannot be imported. TensorFlow is imported here only."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import elmo_jax  # noqa: E402
from conftest import REPO, write_grammar_corpus  # noqa: E402
from elmo_jax.core.bilm import named_leaves  # noqa: E402
from elmo_jax.core.embedding import embed  # noqa: E402
from elmo_jax.formats import saved_model, serving  # noqa: E402

WEIGHTS = os.path.join(REPO, "tests", "fixtures", "bilm-tf", "lm_weights.hdf5")
MANYLANGS = os.path.join(REPO, "tests", "fixtures", "manylangs", "tiny")
TINY = os.path.join(REPO, "configs", "tiny.json")
# runs of spaces, leading and trailing ones, an empty and an all-space sentence,
# a 60-byte token (cut as bilm-tf cuts it), non-ASCII, the boundary tokens
AWKWARD = ["The  cat sat .", "", "   ", " naïve " + "x" * 60 + " ok ", "<S> Мы </S>", "a"]
CHINESE = ["你 什么 时候 方便 ，", "", "未登录词 和 龘 。", "Мы play 😀 " + "长" * 60]
MIX = {"weights": np.array([[0.4, -0.3, 0.9]], np.float32), "gamma": np.array([1.7], np.float32)}


def split(sentences):
    """The default signature's tokens, as Python splits them."""
    return [[w for w in s.split(" ") if w] for s in sentences]


def reference(model, sentences):
    """embed + mix on `batch_to_char_ids` (or the lexicon's ids) of the sentences."""
    tokens = split(sentences)
    C = model.options.char_cnn.max_characters_per_token
    if model.lexicon is None:
        ids = elmo_jax.batch_to_char_ids(tokens, C, min_length=1)
    else:
        ids = model.lexicon.batch_ids(tokens, C, min_length=1)
    out = embed(model.params, ids, model.options, mix=MIX)
    T = max(len(t) for t in tokens)
    layers, elmo = np.asarray(out.layers)[:, :, :T], np.asarray(out.mixed[0])[:, :T]
    lengths = np.array([len(t) for t in tokens], np.int32)
    default = elmo.sum(1) / np.maximum(lengths, 1)[:, None]
    return ids, layers, elmo, default, lengths


def check_outputs(got, model, sentences):
    _, layers, elmo, default, lengths = reference(model, sentences)
    P = model.options.lstm.projection_dim
    assert sorted(got) == ["default", "elmo", "lstm_outputs1", "lstm_outputs2", "sequence_len",
                           "word_emb"]
    np.testing.assert_array_equal(got["sequence_len"], lengths)
    np.testing.assert_allclose(got["word_emb"], layers[0, :, :, :P], atol=1e-5)
    np.testing.assert_allclose(got["lstm_outputs1"], layers[1], atol=1e-5)
    np.testing.assert_allclose(got["lstm_outputs2"], layers[2], atol=1e-5)
    np.testing.assert_allclose(got["elmo"], elmo, atol=1e-5)
    np.testing.assert_allclose(got["default"], default, atol=1e-5)
    assert not np.any(got["default"][lengths == 0])  # zeros, not NaN


def load_with_mix(path):
    loaded = tf.saved_model.load(path)
    loaded.mix_weights.assign(MIX["weights"][0])
    loaded.gamma.assign(MIX["gamma"][0])
    return loaded


def numpy(d):
    return {k: v.numpy() for k, v in d.items()}


@pytest.fixture(scope="module")
def bilm_tf_saved(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("savedmodel") / "elmo")
    serving.export_model(WEIGHTS, out, "savedmodel")
    return out


def test_the_spelling_in_tf_equals_batch_to_char_ids():
    for path, sentences in ((WEIGHTS, AWKWARD), (MANYLANGS, CHINESE + AWKWARD)):
        model = elmo_jax.open_model(path)
        spell, _ = saved_model.tf_spelling(tf, model.options, model.lexicon)
        tokens = split(sentences)
        T = max(len(t) for t in tokens)
        dense = tf.constant([t + [""] * (T - len(t)) for t in tokens])
        real = tf.sequence_mask([len(t) for t in tokens], T)
        want = reference(model, sentences)[0][:, :T]
        np.testing.assert_array_equal(spell(dense, real).numpy(), want, err_msg=path)


@pytest.mark.slow
def test_both_signatures_equal_embed_and_the_mix(bilm_tf_saved):
    loaded = load_with_mix(bilm_tf_saved)
    model = elmo_jax.open_model(WEIGHTS)
    got = numpy(loaded.signatures["default"](tf.constant(AWKWARD)))
    check_outputs(got, model, AWKWARD)
    np.testing.assert_array_equal(numpy(loaded.signatures["serving_default"](
        text=tf.constant(AWKWARD)))["elmo"], got["elmo"])
    tokens = split(AWKWARD)
    width = max(len(t) for t in tokens) + 2  # longer than any sentence: padding with ""
    by_tokens = numpy(loaded.signatures["tokens"](
        tokens=tf.constant([t + [""] * (width - len(t)) for t in tokens]),
        sequence_len=tf.constant([len(t) for t in tokens], tf.int32)))
    T = got["elmo"].shape[1]
    for k, v in got.items():
        np.testing.assert_allclose(by_tokens[k][:, :T] if v.ndim > 2 else by_tokens[k], v,
                                   atol=1e-6, err_msg=k)
    assert by_tokens["elmo"].shape[1] == width
    assert not np.any(by_tokens["elmo"][:, T:])  # padded positions are zeros
    # __call__ (TF2's reusable API) takes both inputs
    np.testing.assert_array_equal(loaded(tf.constant(AWKWARD))["elmo"].numpy(), got["elmo"])
    np.testing.assert_array_equal(
        loaded({"tokens": tf.constant([["a", "b"]]), "sequence_len": tf.constant([2])},
               training=True)["elmo"].numpy(),
        numpy(loaded.signatures["default"](tf.constant(["a b"])))["elmo"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than the tokens"):
        loaded.signatures["tokens"](tokens=tf.constant([["a", ""]]),
                                    sequence_len=tf.constant([3], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="an empty batch"):
        loaded.signatures["default"](tf.constant([], tf.string))


@pytest.mark.slow
def test_a_chinese_manylangs_model_takes_raw_text(tmp_path):
    out = str(tmp_path / "zh")
    serving.export_model(MANYLANGS, out, "savedmodel")
    got = numpy(load_with_mix(out).signatures["default"](tf.constant(CHINESE)))
    check_outputs(got, elmo_jax.open_model(MANYLANGS), CHINESE)


@pytest.mark.slow
def test_tf_hub_loads_it_and_keras_trains_the_mix_not_the_bilm(bilm_tf_saved):
    import tensorflow_hub as hub
    import tf_keras

    assert hub.load(bilm_tf_saved).signatures["default"](tf.constant(["a b"]))["elmo"].shape \
        == (1, 2, 32)
    by_signature = hub.KerasLayer(bilm_tf_saved, signature="tokens", output_key="elmo")
    assert by_signature({"tokens": tf.constant([["a", "b", ""]]),
                         "sequence_len": tf.constant([2])}).shape == (1, 3, 32)
    layer = hub.KerasLayer(bilm_tf_saved, output_key="default", trainable=True)
    assert sorted(v.name for v in layer.trainable_variables) == ["gamma:0", "mix_weights:0"]
    losses, moved, frozen = _fit(layer, tf_keras)
    assert losses[-1] < losses[0], losses
    assert all(m > 1e-4 for m in moved) and not any(frozen)


def _fit(layer, tf_keras, epochs=6):
    """A toy regression on the layer's `default` vector; (losses, how far
    each trainable variable moved, how far each frozen one did)."""
    text = tf_keras.Input(shape=[], dtype=tf.string)
    model = tf_keras.Model(text, tf_keras.layers.Dense(1)(layer(text)))
    model.compile(tf_keras.optimizers.Adam(0.02), "mse")
    x = np.array(["the cat sat", "a dog ran home", "birds fly", "the the the"])
    y = np.array([1.0, -1.0, 0.5, 2.0])
    before = [v.numpy().copy() for v in layer.trainable_variables]
    frozen = [v.numpy().copy() for v in layer.non_trainable_variables]
    losses = model.fit(x, y, epochs=epochs, batch_size=4, verbose=0).history["loss"]
    return (losses, [np.abs(v.numpy() - b).max() for v, b in zip(layer.trainable_variables, before)],
            [np.abs(v.numpy() - b).max() for v, b in zip(layer.non_trainable_variables, frozen)])


SAVED_MODEL_CLI = """
import sys
for name in ("elmo_jax", "jax", "jaxlib", "flax"):
    sys.modules[name] = None  # importing any of them fails
from tensorflow.python.tools import saved_model_cli
sys.argv = ["saved_model_cli"] + sys.argv[1:]
saved_model_cli.main()
"""


@pytest.mark.slow
def test_saved_model_cli_runs_it_without_our_python(bilm_tf_saved, tmp_path):
    sentences = ["the cat  sat", "", "naïve"]
    r = subprocess.run([sys.executable, "-c", SAVED_MODEL_CLI, "run", "--dir", bilm_tf_saved,
                        "--tag_set", "serve", "--signature_def", "serving_default",
                        "--input_exprs", f"text={json.dumps(sentences)}",
                        "--outdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {k: np.load(tmp_path / f"{k}.npy") for k in ("word_emb", "lstm_outputs1",
                                                        "lstm_outputs2", "sequence_len")}
    _, layers, _, _, lengths = reference(elmo_jax.open_model(WEIGHTS), sentences)
    np.testing.assert_array_equal(got["sequence_len"], lengths)
    np.testing.assert_allclose(got["lstm_outputs2"], layers[2], atol=1e-5)
    np.testing.assert_allclose(got["word_emb"], layers[0, :, :, :16], atol=1e-5)


@pytest.mark.e2e
def test_a_model_trained_here_exports_with_a_trainable_bilm(tmp_path):
    """train.py trains a tiny biLM; `train.py export --format savedmodel
    --trainable-bilm` of its workdir equals embed, and Keras moves its biLM."""
    import tensorflow_hub as hub
    import tf_keras

    files = write_grammar_corpus(tmp_path / "data", n_train=60, n_heldout=10)
    train = [sys.executable, os.path.join(REPO, "train.py"), "--config", TINY,
             "--train_files", files["train.txt"], "--vocab_file", files["vocab.txt"],
             "--workdir", str(tmp_path / "run"), "--max_steps", "3", "--batch_size", "4",
             "--log_every", "1", "--no_progress"]
    r = subprocess.run(train, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = str(tmp_path / "served")
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "export", "--model",
                        str(tmp_path / "run"), "--format", "savedmodel", "--trainable-bilm",
                        "--out", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 3
    model = elmo_jax.open_model(str(tmp_path / "run"))
    sentences = ["the cat sat", "", "a dog ran home"]
    got = numpy(load_with_mix(out).signatures["default"](tf.constant(sentences)))
    check_outputs(got, model, sentences)
    layer = hub.KerasLayer(out, output_key="default", trainable=True)
    assert len(layer.trainable_variables) == 2 + len(named_leaves(model.params))
    _, moved, _ = _fit(layer, tf_keras, epochs=2)
    assert all(m > 0 for m in moved[:2]) and sum(m > 0 for m in moved[2:]) > len(moved) // 2
