"""Two processes on this machine stand in for two hosts: `train.py
--coordinator_address` starts `jax.distributed`, each process reads its half of
the shards, the step runs over the global mesh, process 0 writes the metrics,
checkpoints hold both processes' data positions, and a restart of both resumes.
Marked e2e."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, write_grammar_corpus

pytestmark = pytest.mark.e2e


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_two_hosts(files, workdir, max_steps, checkpoint_every=2, extra=((), ())):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    return [subprocess.Popen(
        [sys.executable, os.path.join(REPO, "train.py"), "--config",
         os.path.join(REPO, "configs", "tiny.json"), "--train_files", files,
         "--vocab_file", os.path.join(os.path.dirname(files), "vocab.txt"), "--workdir", workdir,
         "--max_steps", str(max_steps), "--batch_size", "8", "--checkpoint_every",
         str(checkpoint_every), "--log_every", "1", "--no_progress", "--coordinator_address",
         f"localhost:{port}", "--num_processes", "2", "--process_id", str(i), *extra[i]],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]


def _finish(procs):
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _run_two_hosts(files, workdir, max_steps):
    return _finish(_start_two_hosts(files, workdir, max_steps))


def _sharded_corpus(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    lines = open(files["train.txt"]).read().splitlines(keepends=True)
    for i in range(2):  # one shard each
        with open(tmp_path / "data" / f"shard-{i}.txt", "w") as fh:
            fh.writelines(lines[i::2])
    return str(tmp_path / "data" / "shard-*.txt")


def _checkpoints(work):
    return sorted(int(p) for p in os.listdir(os.path.join(work, "checkpoints")) if p.isdigit())


def _train_steps(work):
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        return [json.loads(line)["step"] for line in fh if "train_loss" in line]


def test_two_processes_train_checkpoint_and_resume(tmp_path):
    pattern = _sharded_corpus(tmp_path)
    work = str(tmp_path / "run")

    first = _run_two_hosts(pattern, work, 4)
    assert [r["step"] for r in first] == [4, 4]
    assert first[0]["train_loss"] == first[1]["train_loss"]  # one global loss

    data = json.load(open(os.path.join(work, "checkpoints", "4", "data", "metadata")))
    assert data["process_count"] == 2
    assert data["positions"][0] != data["positions"][1]  # each read its own shard

    again = _run_two_hosts(pattern, work, 6)
    assert [r["step"] for r in again] == [6, 6]
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        steps = [json.loads(line)["step"] for line in fh if "train_loss" in line]
    assert steps == [1, 2, 3, 4, 5, 6]  # resumed at 5, not restarted


@pytest.mark.parametrize("how", ["sigterm", "max_seconds"])
def test_a_stop_reaching_one_process_stops_both_at_one_step(tmp_path, how):
    """Preemption notices and clocks reach hosts one at a time: SIGTERM to
    process 1 only, or a time limit on process 0 only. Both stop at the same
    step after one checkpoint, and a restart of both resumes after it."""
    pattern = _sharded_corpus(tmp_path)
    work = str(tmp_path / "run")
    extra = ((), ()) if how == "sigterm" else (("--max_seconds", "8"), ())
    procs = _start_two_hosts(pattern, work, 100000, checkpoint_every=10**6, extra=extra)
    if how == "sigterm":
        t0 = time.time()
        while not (os.path.exists(os.path.join(work, "metrics.jsonl"))
                   and len(_train_steps(work)) >= 3):
            assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
            assert time.time() - t0 < 300
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)
    first = _finish(procs)
    stopped = first[0]["step"]
    assert first[1]["step"] == stopped and stopped >= (3 if how == "sigterm" else 1)
    assert _checkpoints(work) == [stopped]
    again = _finish(_start_two_hosts(pattern, work, stopped + 2))
    assert [r["step"] for r in again] == [stopped + 2] * 2
    steps = _train_steps(work)
    assert steps[-2:] == [stopped + 1, stopped + 2] and steps.count(stopped + 1) == 1


def test_a_bad_shard_on_one_process_stops_both_naming_the_file(tmp_path):
    """Process 1's shard has a line that is not UTF-8 near its end: it fails
    reading it, and both processes exit non-zero within seconds (not wait in a
    collective or in jax.distributed's shutdown), each error naming the process
    and the file."""
    pattern = _sharded_corpus(tmp_path)
    bad = tmp_path / "data" / "shard-1.txt"
    lines = bad.read_bytes().splitlines(keepends=True)
    lines[-3] = b"the caf\xe9 is closed .\n"
    bad.write_bytes(b"".join(lines))
    t0 = time.time()
    procs = _start_two_hosts(pattern, str(tmp_path / "run"), 20)
    outs = [p.communicate(timeout=120) for p in procs]
    assert time.time() - t0 < 60
    for i, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode != 0, err[-3000:]
        first = next(line for line in err.splitlines() if line.startswith("error:"))
        assert f"process {i} of 2" in first and f"{bad}, line {len(lines) - 2}" in first, err
    assert "because process 1 failed" in outs[0][1]


def test_two_processes_with_different_workdirs_stop_with_a_clear_error(tmp_path):
    """A workdir that is not shared: one process would restore and another start
    afresh, and the first save would wait forever. Both stop before training."""
    pattern = _sharded_corpus(tmp_path)
    procs = _start_two_hosts(pattern, str(tmp_path / "host0"), 4,
                             extra=((), ("--workdir", str(tmp_path / "host1"))))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0, err[-3000:]
        first = next(line for line in err.splitlines() if line.startswith("error:"))
        assert "process(es) 1 do not see the workdir" in first, err[-3000:]
    assert not os.path.exists(tmp_path / "host0" / "checkpoints" / "1")


def test_evaluation_and_init_from_over_two_processes(tmp_path):
    """Each process scores its share of the held-out streams; the perplexity is
    the single-process one. --init_from WORKDIR restores on each process's own
    devices."""
    from elmo_jax import training

    pattern = _sharded_corpus(tmp_path)
    heldout = str(tmp_path / "data" / "heldout.txt")
    work = str(tmp_path / "run")
    extra = ("--eval_files", heldout, "--max_steps", "30")
    records = _finish(_start_two_hosts(pattern, work, 30, checkpoint_every=30,
                                       extra=(extra, extra)))
    assert records[0]["eval_ppl"] == records[1]["eval_ppl"]
    single = training.evaluate_workdir(work, heldout)
    assert single["step"] == 30
    assert records[0]["eval_ppl"] == pytest.approx(single["eval_ppl"], rel=1e-5)
    assert records[0]["eval_tokens"] == single["eval_tokens"]

    tuned = str(tmp_path / "tuned")
    init = ("--init_from", work)
    _finish(_start_two_hosts(pattern, tuned, 1, extra=(init, init)))
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        scratch = [json.loads(line) for line in fh if '"train_loss"' in line][0]
    with open(os.path.join(tuned, "metrics.jsonl")) as fh:
        first = [json.loads(line) for line in fh if '"train_loss"' in line][0]
    assert first["step"] == 1 and first["train_loss"] < scratch["train_loss"] - 0.5
