"""The hdf5 weight format: exact round trip and clear errors."""
import dataclasses
import os

import h5py
import jax
import numpy as np
import pytest

import elmo_jax
from conftest import tiny_options_dict
from elmo_jax.formats.weights import WeightsError


def _read_all(path):
    with h5py.File(path, "r") as fh:
        out = {}
        fh.visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


def test_fixture_round_trip_is_bit_exact(fixture_dir, tmp_path):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    src = os.path.join(fixture_dir, "lm_weights.hdf5")
    elmo_jax.save_weights(tmp_path / "copy.hdf5", elmo_jax.load_weights(src, options), options)
    a, b = _read_all(src), _read_all(tmp_path / "copy.hdf5")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32, name
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def test_random_params_round_trip(tmp_path):
    options = elmo_jax.ElmoOptions.from_dict(tiny_options_dict())
    params = elmo_jax.init_params(options, jax.random.PRNGKey(7))
    elmo_jax.save_weights(tmp_path / "w.hdf5", params, options)
    back = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    flat_a = jax.tree_util.tree_leaves_with_path(params)
    flat_b = dict(jax.tree_util.tree_leaves_with_path(back))
    assert len(flat_a) == len(flat_b)
    for path, leaf in flat_a:
        assert np.asarray(leaf).tobytes() == np.asarray(flat_b[path]).tobytes(), path


def test_mismatched_options_name_the_dataset_and_shapes(fixture_dir):
    d = tiny_options_dict()
    d["lstm"].update(dim=128, projection_dim=16)  # the fixture has 64 cells
    d["char_cnn"].update(filters=[[1, 4], [2, 8], [3, 16], [4, 32], [5, 64]])
    options = elmo_jax.ElmoOptions.from_dict(d)
    with pytest.raises(WeightsError) as e:
        elmo_jax.load_weights(os.path.join(fixture_dir, "lm_weights.hdf5"), options)
    msg = str(e.value)
    assert "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0" in msg
    assert "(32, 256)" in msg and "(32, 512)" in msg


def test_missing_dataset_is_named(fixture_dir):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    three = options.replace(lstm=dataclasses.replace(options.lstm, n_layers=3))
    with pytest.raises(WeightsError, match="Cell2/LSTMCell/W_0' is missing"):
        elmo_jax.load_weights(os.path.join(fixture_dir, "lm_weights.hdf5"), three)


def test_not_hdf5_and_missing_file(tmp_path, fixture_dir):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    bad = tmp_path / "w.hdf5"
    bad.write_text("not hdf5")
    with pytest.raises(WeightsError, match="not a readable hdf5"):
        elmo_jax.load_weights(bad, options)
    with pytest.raises(FileNotFoundError, match="nope.hdf5"):
        elmo_jax.load_weights(tmp_path / "nope.hdf5", options)


def test_save_never_leaves_a_partial_file(tmp_path):
    options = elmo_jax.ElmoOptions.from_dict(tiny_options_dict())
    params = elmo_jax.init_params(options, jax.random.PRNGKey(0))
    target = tmp_path / "w.hdf5"
    elmo_jax.save_weights(target, params, options)
    before = target.read_bytes()
    broken = jax.tree.map(lambda x: x, params)
    broken["lstm"]["layer_0"]["w_proj"] = np.zeros((2, 3, 3), np.float32)
    with pytest.raises(WeightsError):
        elmo_jax.save_weights(target, broken, options)
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["w.hdf5"]


def test_file_without_projection_when_filters_equal_projection(tmp_path):
    """bilm-tf omits CNN_proj when n_filters == projection_dim; that file loads
    as an identity projection."""
    d = tiny_options_dict()
    d["char_cnn"]["filters"] = [[1, 4], [2, 4]]  # 8 filters == projection_dim 8
    options = elmo_jax.ElmoOptions.from_dict(d)
    params = elmo_jax.init_params(options, jax.random.PRNGKey(0))
    elmo_jax.save_weights(tmp_path / "w.hdf5", params, options)
    with h5py.File(tmp_path / "w.hdf5", "a") as fh:
        del fh["CNN_proj"]
    loaded = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    np.testing.assert_array_equal(loaded["char_encoder"]["proj"]["kernel"], np.eye(8))


def _fixture_copy(fixture_dir, tmp_path, edit=None):
    """The fixture weights rewritten with `edit(datasets)` applied."""
    datasets = _read_all(os.path.join(fixture_dir, "lm_weights.hdf5"))
    if edit:
        edit(datasets)
    path = tmp_path / "w.hdf5"
    with h5py.File(path, "w") as fh:
        for name, value in datasets.items():
            fh.create_dataset(name, data=value)
    return path


def test_hostile_weight_files_name_the_dataset(fixture_dir, tmp_path):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    name = "CNN_high_0/W_carry"

    def as_int(ds):
        ds[name] = ds[name].astype(np.int32)
    with pytest.raises(WeightsError, match=f"'{name}' holds int32"):
        elmo_jax.load_weights(_fixture_copy(fixture_dir, tmp_path, as_int), options)

    def as_text(ds):
        ds[name] = np.array([b"x"] * 3)
    with pytest.raises(WeightsError, match=f"'{name}' has shape"):
        elmo_jax.load_weights(_fixture_copy(fixture_dir, tmp_path, as_text), options)

    def with_nan(ds):
        ds[name] = ds[name].copy()
        ds[name][0, 0] = np.nan
        ds[name][1, 1] = np.inf
    with pytest.warns(UserWarning, match=f"'{name}' holds 2 NaN or infinite"):
        elmo_jax.load_weights(_fixture_copy(fixture_dir, tmp_path, with_nan), options)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_truncated_weight_file_is_a_clear_error(fixture_dir, tmp_path, keep):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    data = open(os.path.join(fixture_dir, "lm_weights.hdf5"), "rb").read()
    (tmp_path / "cut.hdf5").write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(WeightsError, match="truncated"):
        elmo_jax.load_weights(tmp_path / "cut.hdf5", options)
