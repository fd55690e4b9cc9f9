"""Two processes on this machine stand in for two hosts: `train.py
--coordinator_address` starts `jax.distributed`, each process makes its rows of
the global batch, the step runs over the global mesh, process 0 writes the
metrics, checkpoints hold every row's data position, a restart of both resumes,
and so does one process alone (and two from one). Marked e2e."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, devices_env, write_grammar_corpus

pytestmark = pytest.mark.e2e


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _train_cmd(files, workdir, max_steps, checkpoint_every):
    return [sys.executable, os.path.join(REPO, "train.py"), "--config",
            os.path.join(REPO, "configs", "tiny.json"), "--train_files", files,
            "--vocab_file", os.path.join(os.path.dirname(files), "vocab.txt"), "--workdir",
            workdir, "--max_steps", str(max_steps), "--batch_size", "8", "--checkpoint_every",
            str(checkpoint_every), "--log_every", "1", "--no_progress"]


def _start_two_hosts(files, workdir, max_steps, checkpoint_every=2, extra=((), ()), wrapper=(),
                     env=None, port=None, which=(0, 1)):
    port = port or _free_port()
    env = dict(devices_env(1, compile_bound=True), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
               **(env or {}))
    return [subprocess.Popen(
        [*_train_cmd(files, workdir, max_steps, checkpoint_every)[:1], *wrapper,
         *_train_cmd(files, workdir, max_steps, checkpoint_every)[1:]]
        + ["--coordinator_address", f"localhost:{port}", "--num_processes", "2",
           "--process_id", str(i), *extra[i]],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in which]


def _one_host(files, workdir, max_steps, checkpoint_every=2, devices=2):
    """One process with `devices` simulated devices."""
    env = devices_env(devices, compile_bound=True)  # as the two hosts' runs
    r = subprocess.run(_train_cmd(files, workdir, max_steps, checkpoint_every), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


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


# train.py with JAX's cross-process collectives counted by the last train step
# dispatched (0 before step 1)
_COUNTING_COLLECTIVES = textwrap.dedent("""
    import atexit, json, runpy, sys
    from jax.experimental import multihost_utils
    from elmo_jax.training import loop
    seen, at = [], {"step": 0}
    for name in ("process_allgather", "broadcast_one_to_all", "sync_global_devices"):
        def counted(*args, _real=getattr(multihost_utils, name), _name=name, **kwargs):
            seen.append([at["step"], _name])
            return _real(*args, **kwargs)
        setattr(multihost_utils, name, counted)
    class Counted:
        def __init__(self, step):
            self.step = step
        def lower(self, *args, **kwargs):
            return self.step.lower(*args, **kwargs)
        def __call__(self, *args, **kwargs):
            at["step"] += 1
            return self.step(*args, **kwargs)
    create = loop.create_train_step
    def counting(*args, **kwargs):
        built = create(*args, **kwargs)
        return built._replace(step=Counted(built.step))
    loop.create_train_step = counting
    atexit.register(lambda: print("COLLECTIVES " + json.dumps(seen), file=sys.stderr))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")



@pytest.mark.parametrize("how", ["sigterm", "max_seconds"])
def test_a_stop_reaching_one_process_stops_both_at_one_step(tmp_path, how):
    """Preemption notices and clocks reach hosts one at a time: SIGTERM to
    process 1 only, or a time limit on process 0 only. Both stop at the same
    step after one checkpoint; a restart of both resumes after it (checked
    once: the restart does not depend on what stopped the run).

    The time-limited run, logging every 10 steps, also counts JAX's
    cross-process collectives by the train step last dispatched: they run
    before step 1 (the workdir agreement), on log steps and at the stop's
    save only; the batches' shapes and the stop checks go through the
    coordination service's key-value store."""
    pattern = _sharded_corpus(tmp_path)
    work = str(tmp_path / "run")
    every = ("--log_every", "10")
    extra = ((), ()) if how == "sigterm" else (("--max_seconds", "8", *every), every)
    wrapper = ("-c", _COUNTING_COLLECTIVES) if how == "max_seconds" else ()
    procs = _start_two_hosts(pattern, work, 100000, checkpoint_every=10**6, extra=extra,
                             wrapper=wrapper)
    if how == "sigterm":
        t0 = time.time()
        while not (os.path.exists(os.path.join(work, "metrics.jsonl"))
                   and len(_train_steps(work)) >= 3):
            assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
            assert time.time() - t0 < 300
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    first = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    stopped = first[0]["step"]
    # a stop is agreed 2 x train.decide_every (10) steps after it is proposed
    assert first[1]["step"] == stopped and stopped >= (3 if how == "sigterm" else 20)
    assert _checkpoints(work) == [stopped]
    if how == "sigterm":  # the stop's time is the slowest process's, said and recorded alike
        said = [re.findall(r"([\d.]+) s after the signal", err) for _, err in outs]
        assert len(said[0]) == 1 and said[0] == said[1], said
        with open(os.path.join(work, "metrics.jsonl")) as fh:
            record = next(r for r in map(json.loads, fh) if r.get("event") == "stopped")
        assert record["signal"] == "process 1: SIGTERM", record
        assert abs(record["stop_seconds"] - float(said[0][0])) <= 0.051, (record, said)
    if how == "max_seconds":
        for _, err in outs:
            line = next(x for x in err.splitlines() if x.startswith("COLLECTIVES "))
            steps = {step for step, _ in json.loads(line.split(" ", 1)[1])}
            assert 0 in steps and steps <= {0, stopped, *range(10, stopped + 1, 10)}, steps
        return  # the restart after a stop is the same in both cases
    again = _finish(_start_two_hosts(pattern, work, stopped + 2))
    assert [r["step"] for r in again] == [stopped + 2] * 2
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        resumed = [r for r in map(json.loads, fh) if r.get("event") == "resumed"]
    assert resumed == [{"step": stopped, "event": "resumed", "from_step": stopped,
                        "processes": 2, "devices": 2, "changed": {
                            "train.checkpoint_every": [10**6, 2],
                            "train.max_steps": [100000, stopped + 2]}}], resumed
    steps = _train_steps(work)
    assert steps[-2:] == [stopped + 1, stopped + 2] and steps.count(stopped + 1) == 1
    # another global batch on resume: the same error on both, nothing trained or written
    before = open(os.path.join(work, "metrics.jsonl")).read()
    procs = _start_two_hosts(pattern, work, stopped + 4, extra=(("--batch_size", "16"),) * 2)
    for p, (_, err) in zip(procs, [p.communicate(timeout=600) for p in procs]):
        assert p.returncode == 2, err[-3000:]
        assert "was trained with model.batch_size 8; this command asks for 16" in err, err[-3000:]
        assert f"--init_from {work} --workdir NEW_DIR" in err, err[-3000:]
    assert _checkpoints(work) == [stopped, stopped + 2]
    assert open(os.path.join(work, "metrics.jsonl")).read() == before


def _losses(work):
    out = {}
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        for record in map(json.loads, fh):
            if "train_loss" in record:
                out[record["step"]] = record["train_loss"]  # a resumed run's records win
    return out


def test_two_processes_train_and_checkpoint_and_resume_on_one_and_one_on_two(tmp_path):
    """Two processes train one global loss and checkpoint every row's data
    position. Resume on another slice: a checkpoint of 2 processes continues
    in 1 (and of 1 in 2, a restart of both) reading exactly the batches an
    uninterrupted run reads: its losses are the uninterrupted run's (2 devices
    every time; the batches' table shapes may differ)."""
    pattern = _sharded_corpus(tmp_path)
    straight = str(tmp_path / "straight")
    _one_host(pattern, straight, 8, checkpoint_every=4)
    want = _losses(straight)
    two_then_one, one_then_two = str(tmp_path / "two-one"), str(tmp_path / "one-two")

    first = _run_two_hosts(pattern, two_then_one, 4)
    assert [r["step"] for r in first] == [4, 4]
    assert first[0]["train_loss"] == first[1]["train_loss"]  # one global loss
    data = json.load(open(os.path.join(two_then_one, "checkpoints", "4", "data", "metadata")))
    assert data["batches"] == 4 and data["batch_size"] == 8  # one position, of every row
    assert os.path.isdir(os.path.join(two_then_one, "checkpoints", "4", "cursors"))

    _one_host(pattern, two_then_one, 8, checkpoint_every=4)
    _one_host(pattern, one_then_two, 4)
    again = _finish(_start_two_hosts(pattern, one_then_two, 8))
    assert [r["step"] for r in again] == [8, 8]
    for work in (two_then_one, one_then_two):
        assert _train_steps(work) == list(range(1, 9))  # resumed at 5, not restarted
        got = _losses(work)
        for step in range(1, 9):
            assert got[step] == pytest.approx(want[step], rel=1e-5), (work, step)


def test_a_bad_shard_on_one_process_stops_both_naming_the_file(tmp_path):
    """Process 1 is given a shard with a line that is not UTF-8 near its end:
    it fails reading it, and both processes exit non-zero within seconds (not
    wait in the first exchange or collective or in jax.distributed's shutdown),
    each error naming the process, and process 1's the file."""
    pattern = _sharded_corpus(tmp_path)
    bad = tmp_path / "bad" / "shard-1.txt"
    os.makedirs(bad.parent)
    lines = (tmp_path / "data" / "shard-1.txt").read_bytes().splitlines(keepends=True)
    lines[-3] = b"the caf\xe9 is closed .\n"
    bad.write_bytes(b"".join(lines))
    t0 = time.time()
    procs = _start_two_hosts(pattern, str(tmp_path / "run"), 20,
                             extra=((), ("--train_files", str(bad))))
    outs = [p.communicate(timeout=120) for p in procs]
    assert time.time() - t0 < 60
    for i, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode != 0, err[-3000:]
        first = next(line for line in err.splitlines() if line.startswith("error:"))
        assert f"process {i} of 2" in first and f"{bad}, line {len(lines) - 2}" in first, err
        assert "Traceback" not in err, err  # a user's mistake: its line, as in one process
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
    the single-process one; each process's profile trace is its own.
    --init_from WORKDIR restores on each process's own devices."""
    from elmo_jax import training

    pattern = _sharded_corpus(tmp_path)
    heldout = str(tmp_path / "data" / "heldout.txt")
    work = str(tmp_path / "run")
    extra = ("--eval_files", heldout, "--max_steps", "30", "--set", "train.profile_steps=5:6")
    records = _finish(_start_two_hosts(pattern, work, 30, checkpoint_every=30,
                                       extra=(extra, extra)))
    assert records[0]["eval_ppl"] == records[1]["eval_ppl"]
    for i in range(2):  # each process's trace in a folder of its own
        traces = os.path.join(work, "tensorboard", f"process-{i}", "plugins", "profile", "*", "*")
        assert any(t.endswith(".xplane.pb") for t in glob.glob(traces)), traces
    # the save at step 30 and the evaluation compiled nothing, on either process
    assert [r["compiled_since_step_1"] for r in records] == [0, 0], records
    single = training.evaluate_workdir(work, heldout)
    assert single["step"] == 30
    assert records[0]["eval_ppl"] == pytest.approx(single["eval_ppl"], rel=1e-5)
    assert records[0]["eval_tokens"] == single["eval_tokens"]

    tuned = str(tmp_path / "tuned")
    init = ("--init_from", work)
    procs = _start_two_hosts(pattern, tuned, 1, extra=(init, init), env={"JAX_LOG_COMPILES": "1"})
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[1][1][-3000:]
    # the same train programs as the run before: process 1 reads them from the
    # cache (which process 0 alone writes) as process 0 does. (A program new to
    # this run, compiled and written by process 0, may be a hit on process 1 too.)
    hits = [set(re.findall(r"Persistent compilation cache hit for '(\w*train\w*)'", err))
            for _, err in outs]
    assert "jit_train_step" in hits[0] and hits[0] <= hits[1], hits
    with open(os.path.join(work, "metrics.jsonl")) as fh:
        scratch = [json.loads(line) for line in fh if '"train_loss"' in line][0]
    with open(os.path.join(tuned, "metrics.jsonl")) as fh:
        first = [json.loads(line) for line in fh if '"train_loss"' in line][0]
    assert first["step"] == 1 and first["train_loss"] < scratch["train_loss"] - 0.5


def test_processes_given_different_runs_stop_before_anything_is_written(tmp_path):
    """Process 1 reads one shard of two, another vocabulary and another dropout:
    both stop before step 1 with one error line naming each difference and
    the processes, and nothing is written to the workdir."""
    pattern = _sharded_corpus(tmp_path)
    vocab = tmp_path / "other-vocab.txt"
    vocab.write_text((tmp_path / "data" / "vocab.txt").read_text() + "zebra\n")
    work = tmp_path / "run"
    procs = _start_two_hosts(pattern, str(work), 4, extra=((), (
        "--train_files", str(tmp_path / "data" / "shard-0.txt"), "--vocab_file", str(vocab),
        "--set", "model.dropout=0.2")))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 2, err[-3000:]
        first = next(line for line in err.splitlines() if line.startswith("error:"))
        assert "were not given the same run, so nothing was trained or written" in first, first
        for fact in ("corpus: process 0 has 2 file(s) [shard-0.txt", "model.dropout: process 0 has 0.1, "
                     "process 1 has 0.2", "vocabulary: process 0 has 34 words", "process 1 has 35 words"):
            assert fact in first, first
    assert not os.path.exists(work / "metrics.jsonl")
    assert not os.listdir(work / "checkpoints") if os.path.exists(work / "checkpoints") else True
    assert not os.path.exists(work / "config.json")


# train.py, where process AT_COMPILE's first part sends itself the signal its
# second part names as it starts compiling
_SIGNALLED_AT_COMPILE = textwrap.dedent("""
    import os, runpy, signal, sys
    from elmo_jax.training import loop
    who, name = os.environ["AT_COMPILE"].split(":")
    real = loop.compile_ahead
    def compile_ahead(*args, **kwargs):
        if sys.argv[sys.argv.index("--process_id") + 1] == who:
            os.kill(os.getpid(), getattr(signal, name))
        return real(*args, **kwargs)
    loop.compile_ahead = compile_ahead
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def _child(proc):
    """The training process under train.py's supervising parent."""
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
        return int(fh.read().split()[0])


@pytest.mark.parametrize("who, what", [("1", "SIGTERM"), ("1", "SIGSTOP"), ("0", "SIGKILL")])
def test_a_notice_or_a_lost_peer_during_start_up(tmp_path, who, what):
    """As a process starts compiling: a SIGTERM to process 1 stops both before
    step 1 (exit 0, a "stopped" record, no checkpoint); process 1 stalled
    (SIGSTOP) ends process 0 with status 2 and a line naming it once
    --heartbeat_timeout has passed; process 0 killed (kill -9) ends process 1
    with status 2 and a line (jax's C++ abort, reported by its parent)."""
    pattern = _sharded_corpus(tmp_path)
    work = tmp_path / "run"
    beat = ("--heartbeat_timeout", "5")
    t0 = time.time()
    procs = _start_two_hosts(pattern, str(work), 50, extra=(beat, beat),
                             wrapper=("-c", _SIGNALLED_AT_COMPILE), env={"AT_COMPILE": f"{who}:{what}"})
    if what == "SIGSTOP":
        out, err = procs[0].communicate(timeout=300)
        child = _child(procs[1])
        os.kill(child, signal.SIGKILL)
        outs = [(out, err), procs[1].communicate(timeout=60)]
    else:
        outs = [p.communicate(timeout=300) for p in procs]
    errors = [next((x for x in err.splitlines() if x.startswith("error:")), err[-2000:])
              for _, err in outs]
    if what == "SIGTERM":
        assert [p.returncode for p in procs] == [0, 0], errors
        records = [json.loads(x) for x in open(work / "metrics.jsonl")]
        assert records[-1]["event"] == "stopped" and records[-1]["before_step_1"], records
        assert records[-1]["signal"] == "process 1: SIGTERM" and records[-1]["step"] == 0
        assert _checkpoints(work) == []
    elif what == "SIGSTOP":
        assert procs[0].returncode == 2, outs[0][1][-3000:]
        assert ("process 0 of 2 stopped: process 1 has not been heard from for" in errors[0]
                and "(--heartbeat_timeout 5)" in errors[0]), errors[0]
        assert procs[1].returncode == 128 + signal.SIGKILL and "SIGKILL" in errors[1]
        assert time.time() - t0 < 120
    else:
        assert procs[1].returncode == 2, outs[1][1][-3000:]
        assert "process 1 of 2 stopped: lost the coordinator (process 0)" in errors[1], errors[1]
        assert procs[0].returncode == 128 + signal.SIGKILL


@pytest.mark.parametrize("when", ["at launch", "while waiting alone"])
def test_a_signal_before_the_processes_meet_is_kept(tmp_path, when):
    """SIGTERM to process 1 the moment its training process is spawned, before
    Python there could catch it (it starts with the signal blocked, so it is
    pending), or while it waits alone for process 0 (in jax's C++ wait): both
    stop before step 1 as for a signal while compiling."""
    pattern = _sharded_corpus(tmp_path)
    work, port = tmp_path / "run", _free_port()
    wait = ("--wait_for_peers", "30" if when == "at launch" else "15")  # saying so at 5 s
    start = lambda i: _start_two_hosts(pattern, str(work), 50, extra=(wait, wait), port=port,
                                       which=(i,))[0]
    later, t0 = start(1), time.time()
    if when == "at launch":
        while True:
            try:
                _child(later)
                break
            except (OSError, IndexError):  # not spawned yet
                assert time.time() - t0 < 60 and later.poll() is None
                time.sleep(0.002)
        later.send_signal(signal.SIGTERM)
        first = start(0)
    else:
        said = [later.stderr.readline()]  # its first line: waiting
        assert "process 1 of 2: waiting for the other processes" in said[0], said
        later.send_signal(signal.SIGTERM)
        said.append(later.stderr.readline())
        assert "SIGTERM kept while waiting for the other processes" in said[1], said
        first = start(0)
    procs = [first, later]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    records = [json.loads(x) for x in open(work / "metrics.jsonl")]
    assert records[-1]["event"] == "stopped" and records[-1]["before_step_1"], records
    assert records[-1]["signal"] == "process 1: SIGTERM" and _checkpoints(work) == []


def _process_1_alone(tmp_path, wait_for_peers):
    """The command of process 1 of 2, whose process 0 never starts."""
    pattern = _sharded_corpus(tmp_path)
    return [*_train_cmd(pattern, str(tmp_path / "run"), 4, 2), "--coordinator_address",
            f"localhost:{_free_port()}", "--num_processes", "2", "--process_id", "1",
            "--wait_for_peers", str(wait_for_peers)]


def test_a_process_waiting_for_its_peers_keeps_one_signal_and_ends_at_a_second(tmp_path):
    """Ctrl-C while process 1 waits alone (its peers never started): the first
    SIGINT is kept for the agreed stop and said so; a second ends it at once,
    status 130, though jax's wait (in C++) has 30 s to go."""
    p = subprocess.Popen(_process_1_alone(tmp_path, 30), env=devices_env(1),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    t0, lines = time.time(), []
    while not any("SIGINT kept while waiting" in x for x in lines):
        lines.append(p.stderr.readline())
        assert lines[-1], lines  # it ended or waited out without saying it kept the signal
    p.send_signal(signal.SIGINT)
    rest = p.communicate(timeout=60)[1]
    assert p.returncode == 130, lines + [rest]
    assert time.time() - t0 < 15, lines + [rest]
    assert "process 1 of 2: stopped by SIGINT while waiting for the other processes" in rest, rest
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_a_process_alone_says_it_waits_and_gives_up(tmp_path):
    """Process 1 started without the others: a line while it waits, then status
    2 and an error line at --wait_for_peers."""
    t0 = time.time()
    r = subprocess.run(_process_1_alone(tmp_path, 6), env=devices_env(1), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert time.time() - t0 < 60
    assert "process 1 of 2: waiting for the other processes at localhost:" in r.stderr, r.stderr
    error = next(x for x in r.stderr.splitlines() if x.startswith("error:"))
    assert "waited 6 s for every process to join" in error and "--wait_for_peers 6" in error
