"""`export_model(..., format="jax")`: the biLM as a `jax.export` program and a
flat weights file, run in a process where elmo_jax and flax cannot be
imported, equals `embed`; the export refuses what it cannot write whole (an
--out that holds something, not a model) and writes a bucket's folder.
No TensorFlow here (test_saved_model.py has it)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import elmo_jax
from conftest import REPO
from elmo_jax.core.embedding import embed
from elmo_jax.formats import export as export_lib
from elmo_jax.formats import jax_export, saved_model, serving
from elmo_jax.storage.copies import FolderNotEmpty

WEIGHTS = os.path.join(REPO, "tests", "fixtures", "bilm-tf", "lm_weights.hdf5")
SENTENCES = [[["The", "cat", "sat", "."], ["Hi"]],
             [["naïve", "x" * 60, "<S>"], ["a", "b"], ["c", "d", "e", "f", "g", "h"]]]

# run with only jax and numpy: elmo_jax and flax cannot be imported
CALLER = """
import sys
for name in ("elmo_jax", "flax", "tensorflow"):
    sys.modules[name] = None
import jax, numpy as np
folder, ids_file, out_file = sys.argv[1:]
with open(folder + "/embed.jaxexport", "rb") as fh:
    program = jax.export.deserialize(fh.read())
weights = dict(np.load(folder + "/weights.npz"))
ids = np.load(ids_file)
outs = {}
for name in ids.files:
    layers, mask = program.call(weights, ids[name])
    outs[name + "_layers"], outs[name + "_mask"] = np.asarray(layers), np.asarray(mask)
np.savez(out_file, **outs)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("jax") / "artifact")
    result = serving.export_model(WEIGHTS, out, "jax")
    assert result == {"format": "jax", "out_dir": out, "step": None}
    return out


def test_the_program_runs_without_elmo_jax_and_equals_embed(exported, tmp_path):
    model = elmo_jax.open_model(WEIGHTS)
    ids = {f"batch{i}": elmo_jax.batch_to_char_ids(s) for i, s in enumerate(SENTENCES)}
    assert len({v.shape[:2] for v in ids.values()}) == 2  # two batch sizes and lengths
    np.savez(tmp_path / "ids.npz", **ids)
    r = subprocess.run([sys.executable, "-c", CALLER, exported, str(tmp_path / "ids.npz"),
                        str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    for name, char_ids in ids.items():
        ref = embed(model.params, char_ids, model.options)
        assert got[name + "_layers"].shape == ref.layers.shape
        np.testing.assert_allclose(got[name + "_layers"], ref.layers, atol=1e-5)
        np.testing.assert_array_equal(got[name + "_mask"], ref.mask)


def test_the_weights_file_is_the_params_flat(exported):
    model = elmo_jax.open_model(WEIGHTS)
    flat = dict(np.load(os.path.join(exported, jax_export.WEIGHTS_NPZ)))
    assert "char_encoder/char_embed" in flat
    assert jax_export.nested_weights(flat).keys() == model.params.keys()
    np.testing.assert_array_equal(flat["char_encoder/char_embed"],
                                  model.params["char_encoder"]["char_embed"])
    assert sorted(os.listdir(exported)) == sorted([jax_export.PROGRAM_FILE,
                                                   jax_export.WEIGHTS_NPZ])


def test_the_files_opened_first_are_the_formats_own_names():
    """serving names them so that --help imports no JAX; they must stay the modules'."""
    assert serving.OPENED_FIRST == {"bilm-tf": (export_lib.OPTIONS_FILE,),
                                    "savedmodel": (saved_model.SAVED_MODEL_FILE,),
                                    "jax": (jax_export.PROGRAM_FILE,)}


def test_bad_exports_are_refused_and_write_nothing(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(FolderNotEmpty, match="not an empty folder"):
        serving.export_model(WEIGHTS, str(full), "jax")
    assert os.listdir(full) == ["keep.txt"]
    with pytest.raises(serving.ExportError, match="unknown export format 'onnx'"):
        serving.export_model(WEIGHTS, str(tmp_path / "a"), "onnx")
    with pytest.raises(serving.ExportError, match="SavedModel"):
        serving.export_model(WEIGHTS, str(tmp_path / "b"), "jax", trainable_bilm=True)
    with pytest.raises(elmo_jax.errors.UserError):
        serving.export_model(str(tmp_path / "nothing"), str(tmp_path / "c"), "jax")
    assert sorted(os.listdir(tmp_path)) == ["full"]  # no half artifact anywhere
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is taken
    serving.export_model(WEIGHTS, str(empty), "jax")
    assert sorted(os.listdir(empty)) == [jax_export.PROGRAM_FILE, jax_export.WEIGHTS_NPZ]


@pytest.mark.e2e
def test_the_command_exports_into_a_bucket(gs_bucket, tmp_path):
    """`train.py export --model M --format jax --out gs://...` (the emulator);
    a second export there is refused, the bucket's copy runs."""
    from elmo_jax.storage import paths

    out = f"{gs_bucket}/served"
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "export", "--model", WEIGHTS,
           "--format", "jax", "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["out_dir"] == out
    assert paths.listdir(out) == [jax_export.PROGRAM_FILE, jax_export.WEIGHTS_NPZ]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "not an empty folder" in again.stderr
    import jax

    program = jax.export.deserialize(paths.read_bytes(f"{out}/{jax_export.PROGRAM_FILE}"))
    paths.download(f"{out}/{jax_export.WEIGHTS_NPZ}", str(tmp_path / "w.npz"))
    ids = elmo_jax.batch_to_char_ids(SENTENCES[0])
    model = elmo_jax.open_model(WEIGHTS)
    layers, _ = program.call(dict(np.load(tmp_path / "w.npz")), ids)
    np.testing.assert_allclose(layers, embed(model.params, ids, model.options).layers, atol=1e-5)


def test_the_library_imports_no_tensorflow():
    """TensorFlow is imported when a SavedModel is written, not before."""
    code = ("import sys, elmo_jax; elmo_jax.export_model; import elmo_jax.formats.saved_model; "
            "import elmo_jax.cli.train; assert 'tensorflow' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
