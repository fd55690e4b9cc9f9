"""Sentence vectors and long inputs, against the layer outputs they are made of."""
import h5py
import numpy as np
import pytest

from conftest import random_tf_datasets, tiny_options_dict
from elmo_jax import Elmo
from elmo_jax.core.batching import windows
from elmo_jax.core.embedding import mix_weights
from elmo_jax.core.options import ElmoOptions
from elmo_jax.formats.weights import datasets_to_params

OPTIONS = ElmoOptions.from_dict(tiny_options_dict())
PARAMS = datasets_to_params(random_tf_datasets(OPTIONS), OPTIONS)
WORDS = "the bank of a river is steep and I play piano every day at the theatre".split()


def sentence(n, seed):
    rng = np.random.default_rng(seed)
    return [WORDS[i] for i in rng.integers(0, len(WORDS), n)]


def test_mix_and_mean_are_made_of_the_layers():
    elmo = Elmo(PARAMS, OPTIONS)
    sentences = [sentence(5, 0), [], sentence(9, 1)]
    layers = elmo.embed_sentences(sentences)
    raw = [0.5, -1.0, 2.0]
    w = 0.7 * np.asarray(mix_weights({"weights": np.asarray([raw], np.float32)})[0])
    mixed = elmo.embed_sentences(sentences, output="mix", mix_weights=raw, gamma=0.7)
    means = elmo.embed_sentences(sentences, output="mean", mix_weights=raw, gamma=0.7)
    for lay, mix, mean in zip(layers, mixed, means):
        want = np.einsum("k,knd->nd", w.astype(np.float64), lay.astype(np.float64))
        assert mix.shape == lay.shape[1:] and np.allclose(mix, want, atol=1e-6)
        assert mean.shape == (OPTIONS.output_dim,)
        assert np.allclose(mean, want.mean(0) if len(want) else 0.0, atol=1e-6)
    equal = elmo.embed_sentences(sentences[:1], output="mean")[0]
    assert np.allclose(equal, layers[0].mean(axis=(0, 1)), atol=1e-6)  # default: equal weights
    assert elmo.embed_sentences([], output="mean") == [] and elmo.embed_sentences([]) == []
    with pytest.raises(ValueError, match="output"):
        elmo.embed_sentences(sentences, output="average")


def test_a_long_sentence_is_embedded_in_windows_of_its_own_layers():
    n, L = 70, 16
    long = sentence(n, 2)
    elmo = Elmo(PARAMS, OPTIONS, max_length=L)
    got = elmo.embed_sentences([long, sentence(3, 3)])
    assert got[0].shape == (3, n, OPTIONS.output_dim)
    full = Elmo(PARAMS, OPTIONS, max_length=1000)
    spans = windows(n, L)
    assert len(spans) > 3 and spans[0][2] == 0 and spans[-1][3] == n
    for a, b, keep_a, keep_b in spans:
        assert b - a <= L and min(keep_a - a, b - keep_b) >= (0 if a == 0 or b == n else L // 8)
        piece = full.embed_sentences([long[a:b]])[0]
        assert np.allclose(got[0][:, keep_a:keep_b], piece[:, keep_a - a:keep_b - a], atol=1e-6)
    # the token layer does not depend on context: the same as one pass over all of it
    assert np.allclose(got[0][0], full.embed_sentences([long])[0][0], atol=1e-6)
    assert np.allclose(got[1], full.embed_sentences([sentence(3, 3)])[0], atol=1e-6)


def test_embed_command_writes_sentence_vectors(tmp_path):
    from elmo_jax.cli.embed import main
    from elmo_jax.formats.export import save_export

    save_export(tmp_path / "model", PARAMS, OPTIONS)
    lines = [" ".join(sentence(6, 4)), "", " ".join(sentence(40, 5))]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    main(["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.hdf5"),
          "--model", str(tmp_path / "model"), "--sentence_vectors", "--max_length", "16",
          "--no_progress"])
    elmo = Elmo(PARAMS, OPTIONS, max_length=16)
    with h5py.File(tmp_path / "v.hdf5") as fh:
        for i, line in enumerate(lines):
            want = elmo.embed_sentences([line.split()])[0]
            want = want.mean(axis=1) if want.shape[1] else np.zeros((3, OPTIONS.output_dim))
            assert fh[str(i)].shape == (3, OPTIONS.output_dim)
            assert np.allclose(fh[str(i)][...], want, atol=1e-6)
