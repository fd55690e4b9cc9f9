"""Sentence scoring with a trained tiny biLM: the scores of a corpus add up to
`train.py eval`'s perplexity on it, a shuffled sentence scores worse, and the
command writes one JSON line per input line. Marked e2e (trains a tiny model)."""
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import elmo_jax
from conftest import REPO, write_grammar_corpus
from elmo_jax import training
from elmo_jax.config import ConfigError, DataConfig, load_config
from elmo_jax.data import read_sentences
from elmo_jax.api.scoring import corpus_perplexity, load_language_model, score_sentences
from elmo_jax.core.softmax import pad_softmax

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("scoring")
    files = write_grammar_corpus(d / "data")
    config = load_config(os.path.join(REPO, "configs", "tiny.json"), [
        "model.batch_size=8", "model.n_negative_samples_batch=16", "train.max_steps=100",
        "train.log_every=50"])
    config = config.replace(data=DataConfig(train_files=files["train.txt"],
                                            vocab_file=files["vocab.txt"]))
    training.train_and_evaluate(config, str(d / "run"), progress=False)
    training.export(str(d / "run"), str(d / "export"))
    return files, d


def test_scores_add_up_to_eval_perplexity(trained):
    files, d = trained
    options, params, softmax, vocab = load_language_model(str(d / "export"))
    sentences = read_sentences(files["heldout.txt"])
    records = score_sentences(params, softmax, options, vocab, sentences, stateful=True)
    run = elmo_jax.open_model(str(d / "run"))  # the checkpoint, as training evaluates it
    one_stream = dataclasses.replace(run.config.train, eval_batch_size=1)
    ev = training.evaluate({"bilm": run.params, "softmax": pad_softmax(run.softmax, len(vocab))},
                           run.options, one_stream, run.vocab, files["heldout.txt"])
    total = corpus_perplexity(records)
    assert total["predictions"] == ev["eval_tokens"]
    for ours, theirs in (("ppl_forward", "eval_ppl_forward"),
                         ("ppl_backward", "eval_ppl_backward"), ("ppl", "eval_ppl")):
        assert total[ours] == pytest.approx(ev[theirs], rel=1e-4), ours
    # stateless scoring starts every sentence afresh: the first one agrees
    fresh = score_sentences(params, softmax, options, vocab, sentences[:5], batch_size=4)
    assert fresh[0]["logprob"] == pytest.approx(records[0]["logprob"], abs=1e-4)
    for r in fresh:
        assert r["ppl"] == pytest.approx(math.exp(-r["logprob"] / (r["tokens"] + 1)))


def test_a_shuffled_sentence_scores_worse(trained):
    files, d = trained
    options, params, softmax, vocab = load_language_model(str(d / "export"))
    sentences = [s for s in read_sentences(files["heldout.txt"]) if len(set(s)) >= 5][:10]
    rng = np.random.default_rng(0)
    shuffled = []
    for s in sentences:
        while True:
            t = list(rng.permutation(s))
            if t != s:
                break
        shuffled.append(t)
    a = score_sentences(params, softmax, options, vocab, sentences)
    b = score_sentences(params, softmax, options, vocab, shuffled)
    for x, y in zip(a, b):
        assert x["logprob"] > y["logprob"] + 1.0, (x, y)


def test_score_command_writes_one_line_per_input_line(trained, tmp_path):
    files, d = trained
    (tmp_path / "in.txt").write_text("the dog sees the cat .\n\nthe cats\u2028see .\n")
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "score", "--model",
                        str(d / "export"), "--input", str(tmp_path / "in.txt"), "--output",
                        str(tmp_path / "out.jsonl")], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert [(x["line"], x["tokens"]) for x in rows] == [(0, 6), (1, 0), (2, 4)]
    assert json.loads(r.stdout)["sentences"] == 3
    # bilm-tf's dumped weights (no softmax) cannot score: a clear error
    os.replace(d / "export" / "softmax.hdf5", tmp_path / "softmax.hdf5")
    try:
        r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "score", "--model",
                            str(d / "export"), "--input", str(tmp_path / "in.txt"), "--output",
                            str(tmp_path / "o2.jsonl")], capture_output=True, text=True,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
    finally:  # back for the other tests (an export never overwrites a folder)
        os.replace(tmp_path / "softmax.hdf5", d / "export" / "softmax.hdf5")
    assert r.returncode == 2 and "has no softmax.hdf5" in r.stderr


def test_score_reads_the_model_and_input_from_a_bucket_and_writes_its_output_there(
        trained, tmp_path, gs_bucket):
    """`score` with every path on gs://: the same lines as a local run's."""
    from elmo_jax.storage import paths

    files, d = trained
    (tmp_path / "in.txt").write_text("the dog sees the cat .\n\nthe cats see .\n")
    for name in os.listdir(d / "export"):
        paths.upload(str(d / "export" / name), f"{gs_bucket}/export/{name}")
    paths.upload(str(tmp_path / "in.txt"), f"{gs_bucket}/in.txt")
    runs = {"local": (str(d / "export"), str(tmp_path / "in.txt"), str(tmp_path / "out.jsonl")),
            "bucket": (f"{gs_bucket}/export", f"{gs_bucket}/in.txt", f"{gs_bucket}/out.jsonl")}
    for model, given, out in runs.values():
        r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "score", "--model",
                            model, "--input", given, "--output", out], capture_output=True,
                           text=True, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert r.returncode == 0, r.stderr[-3000:]
    local = (tmp_path / "out.jsonl").read_text().splitlines()
    remote = paths.read_text(f"{gs_bucket}/out.jsonl").splitlines()
    assert len(local) == 3
    for a, b in zip(local, remote):
        a, b = json.loads(a), json.loads(b)
        assert a.keys() == b.keys() and a["tokens"] == b["tokens"]
        assert b["forward_logprob"] == pytest.approx(a["forward_logprob"], rel=1e-6)
    assert not os.path.exists(tmp_path / "gs:")


def test_every_form_of_a_stored_model_opens_the_same_and_builds_nothing_of_training(trained):
    """open_model: the workdir, its export folder and the export's weights file
    give the same model; opening the workdir and scoring from it (in a fresh
    process) imports nothing of training: no train step, no optimizer."""
    files, d = trained
    forms = [elmo_jax.open_model(str(p)) for p in (d / "run", d / "export",
                                                   d / "export" / "weights.hdf5")]
    assert [m.kind for m in forms] == ["workdir", "export", "weights"]
    assert forms[0].step == 100 and forms[0].vocab.words == forms[1].vocab.words
    for m in forms[1:]:
        assert m.options.same_model(forms[0].options)
        for a, b in zip(jax.tree.leaves((forms[0].params, forms[0].softmax)),
                        jax.tree.leaves((m.params, m.softmax))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    code = ("import sys, elmo_jax; from elmo_jax.api.scoring import load_language_model; "
            f"elmo_jax.open_model({str(d / 'run')!r}); load_language_model({str(d / 'run')!r}); "
            "print(sorted(m for m in sys.modules if m.startswith('elmo_jax.training') "
            "or m == 'optax'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr
    with pytest.raises(ConfigError, match="training workdir"):
        elmo_jax.open_model(str(d / "run"), options=str(d / "export" / "options.json"))


def test_export_says_nothing_but_its_result(trained, caplog):
    """Reading a checkpoint's params for export logs no warning (orbax's
    "Metadata file does not exist" came from opening an item as a step)."""
    files, d = trained
    with caplog.at_level(logging.INFO):
        training.export(str(d / "run"), str(d / "export-again"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (d / "export-again" / "weights.hdf5").exists()
