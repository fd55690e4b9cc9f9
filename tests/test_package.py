"""`pip install .` (not editable) gives the library and the commands, and needs
no checkout: a wheel is built, installed into a fresh venv, and its
`elmo-jax embed` embeds two sentences from another folder. Marked e2e."""
import glob
import json
import os
import shutil
import site
import subprocess
import sys

import h5py
import pytest

from conftest import FIXTURES, REPO

pytestmark = pytest.mark.e2e


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
    return r


def test_wheel_installs_the_commands(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(os.path.join(REPO, "elmo_jax"), src / "elmo_jax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(tmp_path / "dist"), str(src)])
    wheel, = glob.glob(str(tmp_path / "dist" / "elmo_jax-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    # the dependencies (jax, flax, ...) come from this environment, not from the checkout
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    with open(os.path.join(purelib.stdout.strip(), "deps.pth"), "w") as fh:
        fh.write("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    where = _run([str(py), "-c", "import elmo_jax, elmo_jax.config as c; "
                  "print(elmo_jax.__file__); print(c.load_config('tiny').model.lstm.dim)"],
                 cwd=tmp_path, env=env).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == "256"
    # the shipped model opens by name from any folder (the docs' examples use it)
    shipped = _run([str(py), "-c", "import elmo_jax; print(elmo_jax.open_model('bilm-tf-tiny')"
                    ".path)"], cwd=tmp_path, env=env).stdout.strip()
    assert shipped.startswith(str(venv))

    (tmp_path / "in.txt").write_text("The bank of the river .\nI play the piano .\n")
    out = _run([str(venv / "bin" / "elmo-jax"), "embed", "--input", "in.txt", "--output",
                "out.hdf5", "--options", os.path.join(FIXTURES, "options.json"),
                "--weights", os.path.join(FIXTURES, "lm_weights.hdf5"), "--no_progress"],
               cwd=tmp_path, env=env)
    assert json.loads(out.stdout.splitlines()[-1])["sentences"] == 2
    with h5py.File(tmp_path / "out.hdf5") as fh:
        assert fh["0"].shape == (3, 6, 32) and fh["1"].shape == (3, 5, 32)
    for command in (["elmo-jax", "train", "--help"], ["elmo-jax", "score", "--help"],
                    ["elmo-jax-train", "export", "--help"], ["elmo-jax-embed", "--help"]):
        text = _run([str(venv / "bin" / command[0]), *command[1:]], cwd=tmp_path, env=env).stdout
        assert "usage:" in text
        if command[0] == "elmo-jax-embed":  # the docstring's "\n" shown as written
            assert 'Lines end at "\\n" (or "\\r\\n") only' in text
