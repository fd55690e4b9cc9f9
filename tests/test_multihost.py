"""Two processes on this machine stand in for two hosts: `train.py
--coordinator_address` starts `jax.distributed`, each process reads its half of
the shards, the step runs over the global mesh, process 0 writes the metrics,
checkpoints hold both processes' data positions, and a restart of both resumes.
Marked e2e."""
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, write_grammar_corpus

pytestmark = pytest.mark.e2e


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_two_hosts(files, workdir, max_steps):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(REPO, "train.py"), "--config",
         os.path.join(REPO, "configs", "tiny.json"), "--train_files", files,
         "--vocab_file", os.path.join(os.path.dirname(files), "vocab.txt"), "--workdir", workdir,
         "--max_steps", str(max_steps), "--batch_size", "8", "--checkpoint_every", "2",
         "--log_every", "1", "--no_progress", "--coordinator_address", f"localhost:{port}",
         "--num_processes", "2", "--process_id", str(i)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_two_processes_train_checkpoint_and_resume(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    lines = open(files["train.txt"]).read().splitlines(keepends=True)
    for i in range(2):  # one shard each
        with open(tmp_path / "data" / f"shard-{i}.txt", "w") as fh:
            fh.writelines(lines[i::2])
    pattern = str(tmp_path / "data" / "shard-*.txt")
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
