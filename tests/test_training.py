"""Training end to end: it learns, it shards, it resumes exactly, it exports,
and it fails clearly. Marked e2e: these train (tiny) models."""
import collections
import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import elmo_jax
from conftest import FIXTURES, REPO, devices_env, write_grammar_corpus
from elmo_jax import training
from elmo_jax.formats.checkpoints import CheckpointError
from elmo_jax.config import ConfigError, DataConfig, load_config
from elmo_jax.data import DataError, read_sentences
from elmo_jax.core.vocab import VocabError

pytestmark = pytest.mark.e2e
TINY = os.path.join(REPO, "configs", "tiny.json")


def tiny(batch_size=8, negatives=16, **train):
    """configs/tiny.json with a small batch, logging every step."""
    train = {"log_every": 1, "checkpoint_every": 10**6, **train}
    return load_config(TINY, [f"model.batch_size={batch_size}",
                              f"model.n_negative_samples_batch={negatives}"]
                       + [f"train.{k}={json.dumps(v)}" for k, v in train.items()])


def run(config, train_files, vocab_file, workdir, **data):
    """Train `config` on these files in `workdir` (no progress bar)."""
    config = config.replace(data=DataConfig(train_files=train_files, vocab_file=vocab_file, **data))
    return training.train_and_evaluate(config, str(workdir), progress=False)


def metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def losses_by_step(workdir):
    return {m["step"]: m["train_loss"] for m in metrics(workdir) if "train_loss" in m}


def unigram_ppl(train_file, eval_file, vocab_file):
    """Perplexity of an add-one unigram model over the biLM's targets (each
    sentence's words plus one boundary token)."""
    words = elmo_jax.core.vocab.Vocabulary.from_file(vocab_file).words
    counts = collections.Counter()
    for s in read_sentences(train_file):
        counts.update(s + ["</S>"])
    total = sum(counts.values()) + len(words)
    nll, n = 0.0, 0
    for s in read_sentences(eval_file):
        for w in s + ["</S>"]:
            nll -= math.log((counts[w] + 1) / total)
            n += 1
    return math.exp(nll / n)


def test_tiny_learns_the_bilm_tf_fixture_corpus(tmp_path):
    """bilm-tf's own training test: its fixture corpus, perplexity measured on
    it. (Held-out text is test_learning's, on Brown.)"""
    data = os.path.join(FIXTURES, "train", "data.txt")
    vocab = os.path.join(FIXTURES, "train", "vocab.txt")
    config = tiny(max_steps=100, log_every=50)
    last = run(config, data, vocab, tmp_path, eval_files=data)
    unigram = unigram_ppl(data, data, vocab)
    assert last["eval_ppl"] < 0.25 * unigram, (last, unigram)
    assert last["eval_ppl"] < 20  # bilm-tf's test asserts the same bound
    assert last["eval_ppl_forward"] > 1 and last["eval_ppl_backward"] > 1


DEVICE_RUNS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import jax
    from elmo_jax.formats import checkpoints
    from test_training import losses_by_step, run, tiny
    # only the losses matter here: no checkpoint (orbax's first save of 8
    # simulated devices' replicas compiles a slicing program per array and device)
    checkpoints.save = lambda *args, **kwargs: None
    results = []
    for workdir, mesh_model, softmax, workers in {runs!r}:
        config = tiny(max_steps=5, mesh_model=mesh_model, softmax=softmax, softmax_chunk=48,
                      input_workers=workers)
        run(config, {train!r}, {vocab!r}, workdir)
        results.append({{"devices": jax.device_count(), "losses": losses_by_step(workdir)}})
    print(json.dumps(results))
""")


def _device_runs(files, n_devices, runs):
    """Train each of `runs` ((workdir, mesh_model, softmax, input workers)) for 5
    steps in one process on `n_devices` simulated devices; their losses."""
    code = DEVICE_RUNS.format(tests=os.path.join(REPO, "tests"), train=files["train.txt"],
                              vocab=files["vocab.txt"], runs=[(str(r[0]), *r[1:])
                                                              for r in runs])
    r = subprocess.run([sys.executable, "-c", code], env=devices_env(n_devices, True),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_one_device_and_eight_devices_give_the_same_losses(tmp_path):
    """8 simulated devices, data x model = 8x1, 4x2 and 2x4 (the batch rows over
    all 8, the softmax rows split over `model`, its candidates and labels
    gathered from the shards, the full softmax's logsumexp combined across
    them; with model 1 each device's rows from its own whole copy), sampled
    and exact full softmax (in vocabulary chunks): the losses of one device.
    The 8 x 1 run makes its batches in 2 input worker processes. (The runs of
    each device count share a process.)"""
    files = write_grammar_corpus(tmp_path / "data")
    ones = _device_runs(files, 1, [(tmp_path / "one-sampled", 1, "sampled", 0),
                                   (tmp_path / "one-full", 1, "full", 0)])
    eights = _device_runs(files, 8, [(tmp_path / "sampled-1", 1, "sampled", 2),
                                     (tmp_path / "sampled-4", 4, "sampled", 0),
                                     (tmp_path / "full-2", 2, "full", 0)])
    for one, others, softmax in ((ones[0], eights[:2], "sampled"), (ones[1], eights[2:], "full")):
        assert one["devices"] == 1 and len(one["losses"]) == 5
        for model, other in zip((1, 4) if softmax == "sampled" else (2,), others):
            assert other["devices"] == 8
            for step, loss in one["losses"].items():
                assert abs(other["losses"][step] - loss) <= 1e-5 * abs(loss), (softmax, model,
                                                                               step)


def _train_cmd(files, workdir, max_steps, checkpoint_every, *extra):
    return [sys.executable, os.path.join(REPO, "train.py"), "--config", TINY,
            "--train_files", files["train.txt"], "--vocab_file", files["vocab.txt"],
            "--workdir", str(workdir), "--max_steps", str(max_steps), "--batch_size", "8",
            "--checkpoint_every", str(checkpoint_every), "--log_every", "1", "--no_progress",
            *extra]


def _wait_for(predicate, proc, timeout=300):
    t0 = time.time()
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.2)


def test_settings_that_fail_late_are_refused_before_step_one(tmp_path):
    """On 8 devices an eval batch of 6 cannot be split: refused at the start,
    not at the first evaluation after training (where a restarted pod would die
    again and again); so is a held-out glob that matches nothing."""
    files = write_grammar_corpus(tmp_path / "data")
    env = devices_env(8)
    for extra, message in [
            (("--eval_files", files["heldout.txt"], "--set", "train.eval_batch_size=6"),
             "train.eval_batch_size 6 must divide over the 8 devices"),
            (("--eval_files", str(tmp_path / "nothing*.txt")), "no files match")]:
        work = tmp_path / f"run{len(message)}"
        r = subprocess.run(_train_cmd(files, work, 4, 2, "--set", "train.eval_every=2", *extra),
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr, r.stderr[-3000:]
        assert not os.path.exists(work / "metrics.jsonl")  # nothing trained


def test_a_per_device_batch_is_bilm_tf_s_batch_times_the_devices(tmp_path):
    """--per_device_batch (bilm-tf's batch_size is per GPU): on 2 devices, 3 rows
    each train a global batch of 6 (the workdir's config says so); with
    --batch_size as well, a usage error."""
    files = write_grammar_corpus(tmp_path / "data")
    env = devices_env(2)
    cmd = _train_cmd(files, tmp_path / "run", 1, 1)
    cmd[cmd.index("--batch_size"):cmd.index("--batch_size") + 2] = ["--per_device_batch", "3"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.load(open(tmp_path / "run" / "config.json"))["model"]["batch_size"] == 6
    r = subprocess.run(cmd + ["--batch_size", "8"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "give one" in r.stderr, r.stderr[-2000:]


# train.py with orbax's save of step 20 cut short: SIGKILL as soon as the save
# has started (it writes in a background thread), before its files are whole,
# once the metrics log's own thread has written the records before it
_KILLED_DURING_THE_SAVE_OF_STEP_20 = textwrap.dedent("""
    import json, os, runpy, signal, sys, time
    from elmo_jax.formats import checkpoints
    started = checkpoints.save
    metrics = os.path.join(sys.argv[sys.argv.index("--workdir") + 1], "metrics.jsonl")
    def save(mngr, state, positions):
        if int(state.step) == 20:  # the log's thread has written the records up to here
            t0 = time.time()
            while time.time() - t0 < 60 and not (os.path.exists(metrics) and any(
                    json.loads(x).get("step") == 20 for x in open(metrics))):
                time.sleep(0.05)
        started(mngr, state, positions)
        if int(state.step) == 20:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoints.save = save
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_a_run_killed_during_a_save_resumes_from_the_checkpoint_before(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    ref = subprocess.run(_train_cmd(files, tmp_path / "ref", 30, 10), env=env,
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]

    work = tmp_path / "killed"
    killed = subprocess.run([sys.executable, "-c", _KILLED_DURING_THE_SAVE_OF_STEP_20,
                             *_train_cmd(files, work, 30, 10)[1:],
                             "--set", "train.async_checkpoints=true"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = sorted(os.listdir(work / "checkpoints"))
    assert "10" in left and "20" not in left, left        # step 20 never became whole
    assert any(name.startswith("20.") for name in left), left   # it was being written
    assert max(losses_by_step(work)) == 20
    again = subprocess.run(_train_cmd(files, work, 30, 10), env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint of step 10" in again.stderr, again.stderr[-2000:]
    from elmo_jax.training.workdir import read_metrics

    assert [m["from_step"] for m in metrics(work) if m.get("event") == "resumed"] == [10]
    want = losses_by_step(tmp_path / "ref")
    records = [m for m in read_metrics(work) if "train_loss" in m]  # steps 11-20 once
    assert [m["step"] for m in records] == list(range(1, 31))
    got = {m["step"]: m["train_loss"] for m in records}
    for step in range(1, 31):
        assert got[step] == pytest.approx(want[step], rel=1e-6), step


def test_sigterm_saves_a_checkpoint_and_stops_within_the_grace(tmp_path):
    """A preemption notice leaves ~30 s: checkpoint and exit, no held-out
    evaluation (here 100,000 lines, minutes of work), and say how long it took."""
    files = write_grammar_corpus(tmp_path / "data")
    held = tmp_path / "data" / "big_heldout.txt"
    lines = open(files["heldout.txt"]).read().splitlines()
    held.write_text("\n".join(lines[i % len(lines)] for i in range(100_000)) + "\n")
    work = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(files, work, 100000, 10**6, "--eval_files", str(held)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    _wait_for(lambda: os.path.exists(work / "metrics.jsonl") and len(metrics(work)) >= 3, proc)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert time.time() - t0 < 30, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM" in err and "checkpoint saved" in err and "s after the signal" in err
    steps = [int(os.path.basename(p)) for p in glob.glob(str(work / "checkpoints" / "[0-9]*"))]
    assert steps and max(steps) >= 3 and max(steps) == json.loads(out.splitlines()[-1])["step"]
    records = metrics(work)
    assert not any("eval_ppl" in m for m in records)
    stopped = [m for m in records if m.get("event") == "stopped"]
    assert stopped and stopped[0]["signal"] == "SIGTERM" and stopped[0]["stop_seconds"] < 30


def test_export_then_load_reproduces_embed_exactly(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=3)
    run(config, files["train.txt"], files["vocab.txt"], str(tmp_path / "run"))
    training.export(str(tmp_path / "run"), str(tmp_path / "out"))
    trained = elmo_jax.open_model(str(tmp_path / "run")).params
    exported = elmo_jax.ElmoOptions.from_json(tmp_path / "out" / "options.json")
    assert exported.char_cnn.n_characters == 262
    loaded = elmo_jax.load_weights(tmp_path / "out" / "weights.hdf5", exported)
    ids = elmo_jax.batch_to_char_ids([["the", "old", "dog", "sees", "the", "cat", "."], ["a"]])
    a = elmo_jax.embed(trained, ids, exported).layers
    b = elmo_jax.embed(loaded, ids, exported).layers
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(np.abs(np.asarray(a)).max()) > 0


def test_fine_tune_from_exported_weights(tmp_path):
    """--init_from: domain transfer starts from the pretrained biLM, not from scratch."""
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=60)
    run(config, files["train.txt"], files["vocab.txt"], str(tmp_path / "pre"))
    training.export(str(tmp_path / "pre"), str(tmp_path / "export"))
    ft = run(tiny(max_steps=1), files["train.txt"], files["vocab.txt"], tmp_path / "ft",
             init_from=str(tmp_path / "export" / "weights.hdf5"))
    scratch = metrics(tmp_path / "pre")[0]  # step 1 from random weights
    assert scratch["step"] == 1
    assert ft["train_loss"] < scratch["train_loss"] - 0.5, (ft, scratch)
    # a new vocabulary (a domain's): the fresh softmax starts as a
    # pretraining softmax does, at the sampler's unigram law (one Adagrad step
    # moves a bias by less than the learning rate, 0.2)
    words = elmo_jax.core.vocab.Vocabulary.from_file(files["vocab.txt"]).words
    new_vocab = elmo_jax.core.vocab.Vocabulary(words[:3] + ["domain"] + words[3:-2])
    new_vocab.to_file(tmp_path / "new_vocab.txt")
    run(tiny(max_steps=1), files["train.txt"], str(tmp_path / "new_vocab.txt"), tmp_path / "ft2",
        init_from=str(tmp_path / "export" / "weights.hdf5"))
    softmax = elmo_jax.open_model(str(tmp_path / "ft2")).softmax
    V = len(new_vocab)
    k = np.arange(V, dtype=np.float64)
    law = np.log((k + 2) / (k + 1)) / np.log(V + 1)
    assert np.max(np.abs(np.asarray(softmax["b"]) - np.log(law))) < 0.2


def test_bad_inputs_fail_clearly(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=2)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError,
                       match="no training sentences in .*empty.txt: the corpus is empty"):
        run(config, str(tmp_path / "empty.txt"), files["vocab.txt"],
                       str(tmp_path / "w1"))
    (tmp_path / "nospecials.txt").write_text("the\ndog\n")
    with pytest.raises(VocabError, match="lacks the special token"):
        run(config, files["train.txt"], str(tmp_path / "nospecials.txt"),
                       str(tmp_path / "w2"))
    # the CLI says it in one line, without a traceback
    r = subprocess.run(_train_cmd({"train.txt": str(tmp_path / "empty.txt"),
                                   "vocab.txt": files["vocab.txt"]}, tmp_path / "w3", 2, 1),
                       capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr


def _tree_digest(root):
    h = hashlib.sha256()
    for path in sorted(glob.glob(str(root) + "/**", recursive=True)):
        if os.path.isfile(path):
            h.update(path.encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def test_corrupt_checkpoint_is_a_clear_error_and_nothing_is_overwritten(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=2)
    work = str(tmp_path / "run")
    run(config, files["train.txt"], files["vocab.txt"], work)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError,
                       match="no held-out sentences in .*empty.txt: the corpus is empty"):
        training.evaluate_workdir(work, str(tmp_path / "empty.txt"))
    for path in glob.glob(os.path.join(work, "checkpoints", "2", "params", "**"), recursive=True):
        if os.path.isfile(path):
            with open(path, "wb") as fh:
                fh.write(b"garbage")
    before = _tree_digest(work)
    with pytest.raises(CheckpointError, match="cannot be read"):
        run(tiny(max_steps=4), files["train.txt"], files["vocab.txt"], work)
    assert _tree_digest(work) == before


def test_a_batch_that_makes_the_loss_non_finite_is_passed_over(tmp_path, monkeypatch, caplog):
    """One sentence of the corpus holds a word whose batch poisons the step
    (its loss and parameters become NaN, as an overflow's would): the run goes
    back to its last checkpoint, past that batch, and on to its end."""
    caplog.set_level(logging.INFO, logger="elmo_jax")
    from elmo_jax.training import loop

    files = write_grammar_corpus(tmp_path / "data")
    with open(files["train.txt"], "a") as fh:
        fh.write("the poison dog sees the cat .\n")
    with open(files["vocab.txt"], "a") as fh:
        fh.write("poison\n")
    poison = elmo_jax.core.vocab.Vocabulary.from_file(files["vocab.txt"]).encode(["poison"])[0]
    built_by_the_loop = loop.create_train_step

    def create_train_step(*args, **kwargs):
        built = built_by_the_loop(*args, **kwargs)

        def step(state, batch):
            poisoned = bool((np.asarray(batch["targets"]) == poison).any())
            state, m = built.step(state, batch)
            if poisoned:
                state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
                m = {**m, "loss": np.float32(np.nan)}
            return state, m
        return built._replace(step=step)

    monkeypatch.setattr(loop, "create_train_step", create_train_step)
    work = tmp_path / "run"
    last = run(tiny(max_steps=20, checkpoint_every=3), files["train.txt"], files["vocab.txt"], work)
    assert last["step"] == 20 and math.isfinite(last["train_loss"])
    events = [m for m in metrics(work) if m.get("event") == "nonfinite_loss"]
    assert events and all(m["back_to_step"] < m["step"] for m in events)
    seen = collections.defaultdict(list)
    for m in metrics(work):
        if "train_loss" in m:
            seen[m["step"]].append(m["train_loss"])
    for s in range(events[0]["back_to_step"] + 1, events[0]["step"]):  # replayed exactly
        assert len(seen[s]) == 2 and seen[s][0] == pytest.approx(seen[s][1], rel=1e-6), s
    assert any("going back to step" in r.getMessage() for r in caplog.records)
    kept = elmo_jax.open_model(str(work))
    assert kept.step == 20
    assert all(bool(np.isfinite(x).all()) for x in jax.tree.leaves((kept.params, kept.softmax)))


def test_a_loss_that_stays_non_finite_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=50, checkpoint_every=1, learning_rate=1e38)
    work = str(tmp_path / "run")
    with pytest.raises(training.TrainingError, match="training stopped") as e:
        run(config, files["train.txt"], files["vocab.txt"], work)
    bad_step = metrics(work)[-1]["step"]
    events = [m for m in metrics(work) if m.get("event") == "nonfinite_loss"]
    assert len(events) == 4 and metrics(work)[-1]["event"] == "nonfinite_loss"  # 3 skips, then stop
    kept = elmo_jax.open_model(work)
    assert kept.step == bad_step - 1, str(e.value)
    assert all(bool(np.isfinite(x).all()) for x in jax.tree.leaves((kept.params, kept.softmax)))


def test_a_model_without_projection_trains_and_exports(tmp_path):
    """lstm.dim == projection_dim (bilm-tf: no projection, no W_P_0)."""
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=2)
    config = config.replace(model=config.model.replace(
        lstm=dataclasses.replace(config.model.lstm, dim=config.model.lstm.projection_dim)))
    run(config, files["train.txt"], files["vocab.txt"], tmp_path / "run")
    training.export(str(tmp_path / "run"), str(tmp_path / "out"))
    exported = elmo_jax.load_export(tmp_path / "out")
    assert "w_proj" not in exported.params["lstm"]["layer_0"]
    out = elmo_jax.embed(exported.params, elmo_jax.batch_to_char_ids([["the", "dog"]]),
                         exported.options)
    assert np.isfinite(np.asarray(out.layers)).all() and np.abs(np.asarray(out.layers)).max() > 0


def test_n_tokens_vocab_that_contradicts_the_vocabulary_is_refused(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_steps=1)
    config = config.replace(model=config.model.replace(n_tokens_vocab=793471))
    with pytest.raises(ConfigError, match="n_tokens_vocab 793471"):
        run(config, files["train.txt"], files["vocab.txt"], tmp_path / "run")


def test_a_time_limited_run_shows_its_total_and_eta(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="elmo_jax")
    files = write_grammar_corpus(tmp_path / "data")
    config = tiny(max_seconds=4, log_every=5)
    config = config.replace(data=DataConfig(train_files=files["train.txt"],
                                            vocab_file=files["vocab.txt"]))
    last = training.train_and_evaluate(config, str(tmp_path / "run"), progress=True)
    err = capsys.readouterr().err
    assert re.search(r"\|\s*4/4s \[\d\d:\d\d<00:00, .*step=\d+", err), err[-500:]
    assert any("time limit" in r.getMessage() for r in caplog.records)
    assert last["step"] >= 1 and "train_loss" in last  # the last step is logged


def _tensorboard_scalars(directory):
    """{tag: {step: value}} from TFRecord-framed event files, read without TensorFlow."""
    import struct

    from tensorboardX.proto import event_pb2

    out = collections.defaultdict(dict)
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            n, = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                out[v.tag][event.step] = v.simple_value
    return out


def test_the_progress_bar_leaves_out_start_up():
    """The bar appears once step 1 is done: its elapsed time, so its rate and
    ETA, start there, not at the launch (on a pod, minutes of compiling)."""
    from elmo_jax.training.reporting import Progress

    bar = Progress(0, 100, None, enabled=True)
    time.sleep(1.0)  # start-up, compiling
    bar.update(1)
    assert bar.bar is None  # nothing shown before step 1
    bar.begin(1)
    for step in range(1, 11):
        bar.update(step)
    shown = bar.bar.format_dict
    assert shown["n"] == 10 and shown["total"] == 100
    assert shown["elapsed"] < 0.5, shown  # the second of start-up is not in the rate
    bar.close()


def test_compile_count_sees_programs_compiled_after_step_1_and_then_lets_go():
    """`compiled_since_step_1` counts XLA compilations from step 1 on, through
    a JAX monitoring listener that `close` removes."""
    from jax._src import monitoring

    from elmo_jax.training.reporting import CompileCount

    listeners = len(monitoring._event_duration_secs_listeners)
    compiles = CompileCount()
    jax.jit(lambda x: x * 3.0)(np.ones(3, np.float32))  # before step 1: not counted
    assert compiles.since_step_1() == {}
    compiles.step_dispatched()
    jax.jit(lambda x: x - 7.0)(np.ones(5, np.float32))  # a new program after step 1
    f = jax.jit(lambda x: x + 1.0)
    f(np.ones(4, np.float32))
    f(np.ones(4, np.float32))  # the same program again: no compilation
    assert compiles.since_step_1() == {"compiled_since_step_1": 2}
    compiles.close()
    assert len(monitoring._event_duration_secs_listeners) == listeners
    jax.jit(lambda x: x / 9.0)(np.ones(6, np.float32))
    assert compiles.since_step_1() == {"compiled_since_step_1": 2}  # no longer listening


def test_metrics_also_go_to_tensorboard_and_a_profile_on_request(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    run(tiny(max_steps=4, log_every=2, profile_steps="2:3"), files["train.txt"],
        files["vocab.txt"], tmp_path / "run", eval_files=files["heldout.txt"])
    traces = glob.glob(str(tmp_path / "run" / "tensorboard" / "plugins" / "profile" / "*" / "*"))
    assert any(t.endswith(".xplane.pb") for t in traces), traces
    scalars = _tensorboard_scalars(tmp_path / "run" / "tensorboard")
    records = metrics(tmp_path / "run")
    assert [r["step"] for r in records if "train_loss" in r] == [2, 4]
    for r in records:
        for key in ("train_loss", "grad_norm", "eval_ppl"):
            if key in r:
                assert scalars[key][r["step"]] == pytest.approx(r[key], rel=1e-6), key
    assert set(scalars["eval_ppl"]) == {4}


def test_settings_on_resume_a_checkpoint_fixes_are_refused_the_others_applied(tmp_path):
    """Resuming with another global batch or dropout is an error naming both
    values and the way out, before anything compiles; another learning rate
    is applied (a rate of 0 leaves the weights as they were), logged in the
    "resumed" record and written to config.json."""
    from elmo_jax.formats.stored_model import open_model
    from elmo_jax.training.workdir import read_metrics

    files = write_grammar_corpus(tmp_path / "data")
    work = tmp_path / "run"
    args = (files["train.txt"], files["vocab.txt"], work)
    run(tiny(max_steps=2, checkpoint_every=2), *args)
    for changed, saved, asked in ((tiny(batch_size=16, max_steps=4), "8", "16"),
                                  (tiny(max_steps=4).replace(
                                      model=tiny().model.replace(dropout=0.5)), "0.1", "0.5")):
        with pytest.raises(ConfigError) as e:
            run(changed, *args)
        text = str(e.value)
        assert f"trained with model.{'batch_size' if asked == '16' else 'dropout'} {saved}; " \
               f"this command asks for {asked}" in text, text
        assert f"--init_from {work} --workdir NEW_DIR" in text, text
    before = open_model(str(work)).params
    run(tiny(max_steps=4, checkpoint_every=2, learning_rate=0.0), *args)
    after = open_model(str(work), step=4).params
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)
    resumed = [m for m in metrics(work) if m.get("event") == "resumed"]
    assert resumed == [{"step": 2, "event": "resumed", "from_step": 2, "processes": 1,
                        "devices": jax.device_count(),
                        "changed": {"train.learning_rate": [0.2, 0.0],
                                    "train.max_steps": [2, 4]}}], resumed
    assert json.load(open(work / "config.json"))["train"]["learning_rate"] == 0.0
    assert [m["step"] for m in read_metrics(work) if "train_loss" in m] == [1, 2, 3, 4]
