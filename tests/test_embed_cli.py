"""embed.py: a text file -> bilm-tf's dump_bilm_embeddings layout, checked
against elmo_jax.embed on the same weights."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import elmo_jax
from conftest import FIXTURES, REPO

pytestmark = pytest.mark.e2e  # runs the command in subprocesses

OPTIONS = os.path.join(FIXTURES, "options.json")
WEIGHTS = os.path.join(FIXTURES, "lm_weights.hdf5")
LINES = ["The bank of the river .", "", "I play the piano every day .", "Naïve café 日本語 " + "x" * 60]


def run_embed(tmp_path, *extra, lines=LINES, expect_ok=True, env=None):
    inp = tmp_path / "in.txt"
    if isinstance(lines, bytes):
        inp.write_bytes(lines)
    else:
        inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), "--input", str(inp),
                        "--output", str(out), "--no_progress", *extra],
                       capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})))
    if expect_ok:
        assert r.returncode == 0, r.stderr[-3000:]
    return out, r


@pytest.fixture(scope="module")
def fixture_model():
    options = elmo_jax.ElmoOptions.from_json(OPTIONS)
    return options, elmo_jax.load_weights(WEIGHTS, options)


def reference(fixture_model, line, state=None):
    options, params = fixture_model
    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids([line.split()]), options, state)
    return np.asarray(out.layers[:, 0]), out.state


def test_all_layers_in_input_order(tmp_path, fixture_model):
    out, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--batch_size", "2")
    with h5py.File(out) as fh:
        assert sorted(fh) == ["0", "1", "2", "3"]
        assert fh["1"].shape == (3, 0, 32)
        for i, line in enumerate(LINES):
            np.testing.assert_allclose(fh[str(i)][...], reference(fixture_model, line)[0],
                                       atol=1e-5)


def test_layer_and_mix(tmp_path, fixture_model):
    out, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--layer", "2")
    with h5py.File(out) as fh:
        np.testing.assert_allclose(fh["2"][...], reference(fixture_model, LINES[2])[0][2], atol=1e-5)
    out, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--mix", "0,1,2",
                       "--gamma", "0.5")
    w = np.exp([0.0, 1.0, 2.0])
    want = 0.5 * np.einsum("k,knd->nd", w / w.sum(), reference(fixture_model, LINES[0])[0])
    with h5py.File(out) as fh:
        np.testing.assert_allclose(fh["0"][...], want, atol=1e-5)


def test_stateful_carries_state_from_line_to_line(tmp_path, fixture_model):
    out, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--stateful")
    state = None
    with h5py.File(out) as fh:
        for i, line in enumerate(LINES):
            want, state = reference(fixture_model, line, state)
            np.testing.assert_allclose(fh[str(i)][...], want, atol=1e-5)


def test_cache_vocab_equals_plain_path(tmp_path):
    plain, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--stateful")
    os.rename(plain, tmp_path / "plain.hdf5")
    cached, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--cache_vocab",
                          os.path.join(FIXTURES, "vocab_test.txt"), "--stateful")
    with h5py.File(tmp_path / "plain.hdf5") as a, h5py.File(cached) as b:
        for k in a:
            np.testing.assert_allclose(a[k][...], b[k][...], atol=1e-5)


def test_tokenize_raw_text(tmp_path):
    out, _ = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--tokenize",
                       lines=["Hello, world. It's fine."])
    with h5py.File(out) as fh:
        assert fh["0"].shape[1] == 8  # Hello , world . It 's fine .


@pytest.mark.parametrize("package, lang, line, message", [
    ("sacremoses", "en", "Hello, world.",
     "error: tokenising needs sacremoses: pip install sacremoses (or elmo-jax[corpora])"),
    ("jieba", "zh", "你什么时候方便",
     "error: Chinese segmentation needs jieba: pip install 'elmo-jax[zh]' (or pip install "
     "jieba)")])
def test_tokenize_without_its_package_says_what_to_install(tmp_path, package, lang, line,
                                                          message):
    """sacremoses and jieba are optional dependencies (the `corpora` and `zh`
    extras): without one, --tokenize is a one-line error naming it, not a
    traceback."""
    hidden = tmp_path / "hide" / package
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(f"raise ImportError(\"No module named '{package}'\")\n")
    _, r = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS, "--tokenize", lang,
                     lines=[line], expect_ok=False, env={"PYTHONPATH": str(tmp_path / "hide")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "out.hdf5").exists()


def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path):
    _, r = run_embed(tmp_path, "--options", OPTIONS, "--weights", WEIGHTS,
                     lines=b"good line\nbad \xff line\n", expect_ok=False)
    assert r.returncode == 2 and "line 2: not valid UTF-8" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out.hdf5").exists()
    d = tmp_path / "wrong"
    d.mkdir()
    bad = elmo_jax.ElmoOptions.from_json(OPTIONS).to_dict()
    bad["lstm"]["dim"] = 128
    elmo_jax.ElmoOptions.from_dict(bad).to_json(d / "options.json")
    _, r = run_embed(tmp_path, "--options", str(d / "options.json"), "--weights", WEIGHTS,
                     expect_ok=False)
    assert r.returncode == 2 and "LSTMCell/W_0' has shape (32, 256), expected (32, 512)" in r.stderr
