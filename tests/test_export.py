"""The export folder: one writer, one reader, both formats' rules in one place."""
import os

import dataclasses

import jax
import numpy as np
import pytest

import elmo_jax
from conftest import FIXTURES
from elmo_jax.formats.export import OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE, load_export, save_export
from elmo_jax.core.vocab import Vocabulary


def _fixture():
    options = elmo_jax.ElmoOptions.from_json(os.path.join(FIXTURES, "options.json"))
    return options, elmo_jax.load_weights(os.path.join(FIXTURES, "lm_weights.hdf5"), options)


def test_save_then_load_is_exact_and_states_262_characters(tmp_path):
    options, params = _fixture()
    training_options = options.replace(
        char_cnn=dataclasses.replace(options.char_cnn, n_characters=261))
    vocab = Vocabulary.from_file(os.path.join(FIXTURES, "train", "vocab.txt"))
    save_export(tmp_path / "out", params, training_options, vocab)
    assert sorted(os.listdir(tmp_path / "out")) == sorted([OPTIONS_FILE, WEIGHTS_FILE, VOCAB_FILE])
    loaded = load_export(tmp_path / "out")
    assert loaded.options.char_cnn.n_characters == 262
    assert loaded.options.same_model(training_options)
    assert loaded.vocab.words == vocab.words
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(a, b)
    # a weights file with its options beside it is the same export
    again = load_export(tmp_path / "out" / WEIGHTS_FILE)
    assert again.options == loaded.options


def test_published_file_names_need_options(tmp_path):
    options, params = _fixture()
    elmo_jax.save_weights(tmp_path / "elmo_weights.hdf5", params, options)
    with pytest.raises(FileNotFoundError, match="options file not found"):
        load_export(tmp_path / "elmo_weights.hdf5")
    loaded = load_export(tmp_path / "elmo_weights.hdf5",
                         options=os.path.join(FIXTURES, "options.json"))
    assert loaded.vocab is None and loaded.options.lstm == options.lstm


def test_missing_folder_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="options file not found"):
        load_export(tmp_path)
    options, _ = _fixture()
    options.to_json(tmp_path / OPTIONS_FILE)
    with pytest.raises(FileNotFoundError, match="weight file not found"):
        load_export(tmp_path)
