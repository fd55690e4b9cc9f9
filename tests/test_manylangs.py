"""ELMoForManyLangs' model folders read without torch, against the vectors that
package computed for them (`Embedder(dir).sents2elmo(s, output_layer=-2)` from
a zero state): tests/fixtures/manylangs/tiny (a word table, legacy pickles)
and tests/fixtures/manylangs-nowords (no word table, tokens cut to 18
characters); the same model with torch's zip-format pickles; export and back."""
import json
import os
import pickle
import shutil
import zipfile

import h5py
import jax
import numpy as np
import pytest

from conftest import HERE, REPO
from elmo_jax import Elmo, embed, open_model
from elmo_jax.formats.export import save_export
from elmo_jax.formats.manylangs import architecture, is_manylangs
from elmo_jax.formats.stored_model import is_workdir
from elmo_jax.formats.torch_pickle import TorchPickleError, load_state_dict

TINY = os.path.join(HERE, "fixtures", "manylangs", "tiny")  # a copy of ../shared/fixtures/manylangs
NOWORDS = os.path.join(HERE, "fixtures", "manylangs-nowords")
ZIP_PICKLES = os.path.join(HERE, "fixtures", "manylangs-zip")
TOL = 2e-5


def expected(folder):
    sentences = json.load(open(os.path.join(folder, "sentences.json"), encoding="utf-8"))
    with h5py.File(os.path.join(folder, "expected.hdf5")) as fh:
        return sentences, [fh[str(i)][...] for i in range(len(sentences))]


def assert_matches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if w.size:
            assert np.abs(g - w).max() <= TOL


@pytest.mark.parametrize("folder", [TINY, NOWORDS], ids=["tiny", "nowords"])
def test_vectors_equal_elmoformanylangs(folder):
    sentences, want = expected(folder)
    elmo = Elmo.from_pretrained(folder)
    assert_matches(elmo.embed_sentences(sentences), want)


@pytest.mark.slow
def test_the_pure_embed_jitted_and_eager():
    sentences, want = expected(TINY)
    model = open_model(TINY)
    ids = model.lexicon.batch_ids([sentences[2]], model.options.char_cnn.max_characters_per_token)
    jitted = np.asarray(embed(model.params, ids, model.options).layers[:, 0])
    with jax.disable_jit():
        eager = np.asarray(embed(model.params, ids, model.options).layers[:, 0])
    assert np.abs(jitted - want[2]).max() <= TOL and np.abs(eager - want[2]).max() <= TOL


def test_zip_format_pickles_read_as_the_legacy_ones():
    for name in ("token_embedder.pkl", "encoder.pkl"):
        legacy, new = (load_state_dict(os.path.join(d, name)) for d in (TINY, ZIP_PICKLES))
        assert list(legacy) == list(new)
        for k in legacy:
            assert legacy[k].dtype == np.float32 and np.array_equal(legacy[k], new[k]), k


def test_a_pickle_that_asks_for_anything_else_is_refused(tmp_path):
    evil = tmp_path / "encoder.pkl"
    with open(evil, "wb") as fh:  # the legacy header, then an object calling os.system
        for obj in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
            pickle.dump(obj, fh, protocol=2)
        fh.write(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(TorchPickleError, match="os.system.*refused"):
        load_state_dict(evil)
    short = tmp_path / "short.pkl"
    data = open(os.path.join(TINY, "encoder.pkl"), "rb").read()
    short.write_bytes(data[: len(data) // 2])
    with pytest.raises(TorchPickleError, match="truncated"):
        load_state_dict(short)


def test_a_folder_is_told_from_a_workdir_by_its_config(tmp_path):
    assert is_manylangs(TINY) and not is_workdir(TINY)
    # the released archives' config.json names the package's architecture file,
    # which the folder does not hold: the released architecture stands in
    folder = tmp_path / "released"
    shutil.copytree(TINY, folder)
    json.dump({"config_path": "../configs/cnn_50_100_512_4096_sample.json"},
              open(folder / "config.json", "w"))
    assert architecture(str(folder))["encoder"]["dim"] == 4096
    with pytest.raises(ValueError, match="go with this config"):  # not these pickles
        open_model(folder)


def test_export_reads_back_exactly_and_a_zip_of_the_folder_opens(tmp_path):
    sentences, want = expected(TINY)
    model = open_model(TINY)
    out = save_export(tmp_path / "export", model.params, model.options, lexicon=model.lexicon)
    back = open_model(out)
    assert back.options == model.options and back.lexicon.chars == model.lexicon.chars
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
        assert np.array_equal(a, b)
    assert_matches(Elmo.from_pretrained(out).embed_sentences(sentences[:3]), want[:3])
    archive = tmp_path / "tiny.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in os.listdir(TINY):
            z.write(os.path.join(TINY, name), f"tiny.model/{name}")
    assert_matches(Elmo.from_pretrained(str(archive)).embed_sentences(sentences), want)


@pytest.mark.e2e
def test_fine_tunes_and_exports_with_its_lexicon(tmp_path):
    """--init_from an ELMoForManyLangs folder: the run spells with its lexicon
    (kept in the workdir and the export); at a learning rate of zero the
    exported model still gives the package's vectors, and a real run learns."""
    from elmo_jax import training
    from elmo_jax.config import DataConfig, load_config

    corpus = ["你 什么 时候 方便 ， 我们 一起 吃 个 饭 。",
              "12号 地铁线 马上 就要 开通 了 ， 以后 我们 出行 就 更加 方便 了 。",
              "The bank of the river is steep .", "I play the piano every day ."] * 8
    (tmp_path / "train.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    words = sorted({w for line in corpus for w in line.split()})
    (tmp_path / "vocab.txt").write_text("\n".join(["<S>", "</S>", "<UNK>"] + words) + "\n",
                                        encoding="utf-8")
    sentences, want = expected(TINY)

    def run(workdir, steps, rate):
        config = load_config(os.path.join(REPO, "configs", "tiny.json"), [
            "model.batch_size=4", "model.unroll_steps=6", "model.n_negative_samples_batch=8",
            f"train.max_steps={steps}", "train.log_every=1", f"train.learning_rate={rate}"])
        config = config.replace(data=DataConfig(
            train_files=str(tmp_path / "train.txt"), vocab_file=str(tmp_path / "vocab.txt"),
            eval_files=str(tmp_path / "train.txt"), init_from=TINY))
        return training.train_and_evaluate(config, str(workdir), progress=False)

    first = run(tmp_path / "still", 2, 1e-30)["eval_ppl"]  # the pretrained model's
    training.export(str(tmp_path / "still"), str(tmp_path / "export"))
    assert_matches(Elmo.from_pretrained(str(tmp_path / "export")).embed_sentences(sentences),
                   want)
    last = run(tmp_path / "ft", 40, 0.2)["eval_ppl"]
    assert last < 0.75 * first, (first, last)
