"""Training, exporting and embedding with every path in a bucket, against
fake-gcs-server and moto's S3 server on 127.0.0.1 (`storage_servers`): a pod's
hosts share no disk, so the workdir, the corpus and the vocabulary are all
gs:// paths and each process runs in a folder of its own. Marked e2e."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, devices_env, write_grammar_corpus
from elmo_jax.storage import files as files_lib
from elmo_jax.storage import copies, paths
pytestmark = pytest.mark.e2e
TINY = os.path.join(REPO, "configs", "tiny.json")


def _train_cmd(train, vocab, workdir, max_steps, checkpoint_every=2, *extra):
    return [sys.executable, os.path.join(REPO, "train.py"), "--config", TINY,
            "--train_files", train, "--vocab_file", vocab, "--workdir", workdir,
            "--max_steps", str(max_steps), "--batch_size", "8",
            "--checkpoint_every", str(checkpoint_every), "--log_every", "1", "--no_progress",
            *extra]


def _upload_corpus(tmp_path, bucket):
    """The grammar corpus in two shards, its held-out file and vocabulary in
    `bucket`/data; the local copies' paths, and the bucket's."""
    local = write_grammar_corpus(tmp_path / "data")
    lines = open(local["train.txt"]).read().splitlines(keepends=True)
    for i in range(2):
        with open(tmp_path / "data" / f"shard-{i}.txt", "w") as fh:
            fh.writelines(lines[i::2])
        paths.upload(str(tmp_path / "data" / f"shard-{i}.txt"), f"{bucket}/data/shard-{i}.txt")
    for name in ("heldout.txt", "vocab.txt"):
        paths.upload(local[name], f"{bucket}/data/{name}")
    return ({"train": str(tmp_path / "data" / "shard-*.txt"), "vocab": local["vocab.txt"]},
            {"train": f"{bucket}/data/shard-*.txt", "vocab": f"{bucket}/data/vocab.txt",
             "heldout": f"{bucket}/data/heldout.txt"})


def _records(workdir):
    return [json.loads(line) for line in paths.read_text(f"{workdir}/metrics.jsonl").splitlines()]


def _losses(workdir):
    return {r["step"]: r["train_loss"] for r in _records(workdir) if "train_loss" in r}


def _steps(workdir):
    return sorted(int(n) for n in paths.listdir(f"{workdir}/checkpoints") if n.isdigit())


def _two_hosts(cmd, cwds, env):
    port = __import__("storage_servers").free_port()
    return [subprocess.Popen(cmd + ["--coordinator_address", f"localhost:{port}",
                                    "--num_processes", "2", "--process_id", str(i)],
                             cwd=cwds[i], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(2)]


def test_two_processes_train_in_a_bucket_stop_on_sigterm_and_one_resumes_as_a_local_run(
        tmp_path, gs_bucket):
    """Two processes (gloo), each in a folder of its own, train with a gs://
    workdir and a gs:// corpus; SIGTERM to process 1 stops both at one step
    with its checkpoint in the bucket; one process resumes it there. The
    losses are those of an uninterrupted local run, nothing of the run is
    written to a local folder, and the bucket holds the run's record whole."""
    local, remote = _upload_corpus(tmp_path, gs_bucket)
    work = f"{gs_bucket}/run"
    cwds = [tmp_path / "host-0", tmp_path / "host-1"]
    for c in cwds:
        c.mkdir()
    env2 = dict(devices_env(1, compile_bound=True), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    procs = _two_hosts(_train_cmd(remote["train"], remote["vocab"], work, 100000, 10**6,
                                  "--set", "train.decide_every=1"), cwds, env2)
    t0 = time.time()
    while not (paths.exists(f"{work}/metrics.jsonl") and len(_losses(work)) >= 3):
        assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
        assert time.time() - t0 < 300
        time.sleep(0.3)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    stopped = json.loads(outs[0][0].strip().splitlines()[-1])["step"]
    assert stopped >= 3 and _steps(work) == [stopped]
    last = stopped + 3
    straight = str(tmp_path / "straight")
    env = devices_env(2, compile_bound=True)
    r = subprocess.run(_train_cmd(local["train"], local["vocab"], straight, last, 10**6), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    want = {json.loads(x)["step"]: json.loads(x)["train_loss"]
            for x in open(os.path.join(straight, "metrics.jsonl")) if "train_loss" in x}

    r = subprocess.run(_train_cmd(remote["train"], remote["vocab"], work, last, 10**6,
                                  "--eval_files", remote["heldout"]),
                       cwd=cwds[0], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from the checkpoint of step {stopped}" in r.stderr
    for c in cwds:  # no "gs:" folder, nothing else either
        assert os.listdir(c) == [], os.listdir(c)
    from elmo_jax.training.workdir import read_metrics

    records = read_metrics(work)
    got = {m["step"]: m["train_loss"] for m in records if "train_loss" in m}
    assert sorted(got) == list(range(1, last + 1))
    for step in range(1, last + 1):
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
    assert [m["event"] for m in _records(work) if "event" in m] == ["stopped", "resumed"]
    assert "eval_ppl" in records[-1]
    assert any(n.startswith("events.out.tfevents") for n in paths.listdir(f"{work}/tensorboard"))
    assert set(paths.listdir(work)) >= {"config.json", "vocab.txt", "checkpoints"}


# train.py killed in the save of step 4: on GCS orbax writes a step's objects
# where they stay and commits the step with a commit_success.txt object last;
# SIGKILL just before the first commit of step 4's objects
_KILLED_DURING_THE_SAVE_OF_STEP_4 = """
import os, runpy, signal, sys
from orbax.checkpoint._src.path import atomicity
commit = atomicity.CommitFileTemporaryPath.finalize
async def finalize(self, *args, **kwargs):
    if "/checkpoints/4" in str(self._final_path):
        os.kill(os.getpid(), signal.SIGKILL)
    return await commit(self, *args, **kwargs)
atomicity.CommitFileTemporaryPath.finalize = finalize
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_run_killed_during_a_save_to_a_bucket_resumes_from_the_checkpoint_before(
        tmp_path, gs_bucket):
    local, remote = _upload_corpus(tmp_path, gs_bucket)
    env = devices_env(1, compile_bound=True)
    ref = str(tmp_path / "ref")
    r = subprocess.run(_train_cmd(local["train"], local["vocab"], ref, 6), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    want = {json.loads(x)["step"]: json.loads(x)["train_loss"]
            for x in open(os.path.join(ref, "metrics.jsonl")) if "train_loss" in x}
    work = f"{gs_bucket}/killed"
    # the caches in the bucket too: JAX's compiled programs (ELMO_JAX_CACHE/xla)
    env = {k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(ELMO_JAX_CACHE=f"{gs_bucket}/cache", XDG_CACHE_HOME=str(tmp_path / "local"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_LOG_COMPILES="1")
    killed = subprocess.run([sys.executable, "-c", _KILLED_DURING_THE_SAVE_OF_STEP_4,
                             *_train_cmd(remote["train"], remote["vocab"], work, 6)[1:]],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "4" in paths.listdir(f"{work}/checkpoints")  # its objects were being written
    assert _steps(work) == [2, 4]
    from elmo_jax.formats import checkpoints

    assert checkpoints.latest_step(work) == 2  # the newest whole one: 4 was never committed
    again = subprocess.run(_train_cmd(remote["train"], remote["vocab"], work, 6), cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint of step 2" in again.stderr, again.stderr[-2000:]
    # the resumed run read the killed run's train step from the bucket and
    # compiled nothing after step 1
    assert "Persistent compilation cache hit for 'jit_train_step'" in again.stderr
    assert any(n.endswith("-cache") for n in paths.listdir(f"{gs_bucket}/cache/xla"))
    assert json.loads(again.stdout.strip().splitlines()[-1])["compiled_since_step_1"] == 0
    assert not os.path.exists(tmp_path / "gs:")
    from elmo_jax.training.workdir import read_metrics

    got = {m["step"]: m["train_loss"] for m in read_metrics(work) if "train_loss" in m}
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 7):
        assert got[step] == pytest.approx(want[step], rel=1e-6), step

    # the export, to GCS and to S3, opens from there as the local one does
    export_local = str(tmp_path / "export")
    for out in (export_local, f"{gs_bucket}/export"):
        r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "export",
                            "--workdir", work, "--out", out], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    from elmo_jax.formats.stored_model import open_model

    a, b, c = open_model(export_local), open_model(f"{gs_bucket}/export"), open_model(work)
    flat = lambda m: {k: np.asarray(v) for k, v in _leaves(m.params)}
    for other in (b, c):
        assert flat(a).keys() == flat(other).keys()
        for k, v in flat(a).items():
            np.testing.assert_array_equal(v, flat(other)[k], err_msg=k)
        assert other.vocab.words == a.vocab.words


def _leaves(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


def test_an_export_on_s3_and_a_workdir_on_s3_refused_before_anything_is_written(
        tmp_path, s3):
    """Exports, data and records go to s3://; orbax 0.12 cannot write
    checkpoints there, so an s3:// workdir is one error line naming the ways
    out, and nothing is written."""
    import storage_servers

    bucket = storage_servers.new_bucket("s3")
    from conftest import random_tf_datasets, tiny_options_dict
    from elmo_jax.formats.export import save_export
    from elmo_jax.core.options import ElmoOptions
    from elmo_jax.formats.stored_model import open_model
    from elmo_jax.formats.weights import datasets_to_params

    options = ElmoOptions.from_dict(tiny_options_dict())
    params = datasets_to_params(random_tf_datasets(options), options)
    save_export(f"{bucket}/export", params, options)
    assert sorted(paths.listdir(f"{bucket}/export")) == ["options.json", "weights.hdf5"]
    opened = open_model(f"{bucket}/export")
    for k, v in _leaves(params):
        np.testing.assert_array_equal(np.asarray(v), np.asarray(dict(_leaves(opened.params))[k]))

    data = write_grammar_corpus(tmp_path / "data")
    r = subprocess.run(_train_cmd(data["train.txt"], data["vocab.txt"], f"{bucket}/run", 2),
                       cwd=tmp_path, env=devices_env(1), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "checkpoints cannot be written to s3://" in r.stderr and "gs://" in r.stderr
    assert "Traceback" not in r.stderr
    assert paths.listdir(f"{bucket}/run") == [] and sorted(os.listdir(tmp_path)) == ["data"]
    files_lib.write_text(f"{bucket}/x.txt", "x")  # the bucket itself works


def test_no_google_credentials_is_one_line_while_the_metadata_server_does_not_answer(
        tmp_path):
    """A machine with no Google credentials whose metadata address takes
    connections and never answers (where gcsfs's probes and then its
    anonymous requests take a minute or more): `train.py --workdir gs://...`
    is one line naming what to set, within the probe's bound, and nothing is
    written."""
    import socket
    import threading

    silent = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.extend(iter(lambda: silent.accept(), None)),
                     daemon=True).start()
    data = write_grammar_corpus(tmp_path / "data")
    env = {k: v for k, v in devices_env(1).items()
           if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                        "FSSPEC_GCS_TOKEN", "NO_GCE_CHECK")}
    env.update(HOME=str(tmp_path / "home"), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               GCE_METADATA_HOST=f"127.0.0.1:{silent.getsockname()[1]}")
    t0 = time.monotonic()
    r = subprocess.run(_train_cmd(data["train.txt"], data["vocab.txt"], "gs://elmo-jax-b/run",
                                  2), cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    took = time.monotonic() - t0
    silent.close()
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: no credentials for gs://elmo-jax-b/run: set GOOGLE_APPLICATION_CREDENTIALS")
    assert "no metadata server answered" in r.stderr and "Traceback" not in r.stderr
    assert held, "the metadata address was not asked"
    assert sorted(os.listdir(tmp_path)) == ["data"]
    assert took < 60, took  # not gcsfs's minute and more of probes and retries


_KILLED_INSIDE_CHUNK_2 = """
import os, sys
from elmo_jax.corpus import shard_writers as store
finish = store.BucketShardWriter.finish_chunk
def finish_chunk(self, *a, **k):
    if len(self.markers) == 2:  # chunk 2's rows uploaded, then death before its marker
        self._rows.close()
        from elmo_jax.storage import copies, paths
        paths.upload(self._rows.name, paths.join(self.dir, "chunk-000002.vectors.bin"))
        os._exit(137)
    finish(self, *a, **k)
store.BucketShardWriter.finish_chunk = finish_chunk
from elmo_jax.cli import embed
embed.main(sys.argv[1:])
"""


def _store_files(folder):
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            out[os.path.relpath(os.path.join(root, n), folder)] = open(
                os.path.join(root, n), "rb").read()
    return out


def test_a_corpus_job_into_a_bucket_killed_and_resumed_is_the_local_store_bit_for_bit(
        tmp_path, gs_bucket, s3, monkeypatch):
    """`embed --input gs://... --output gs://.../store`: write-once objects;
    killed with a chunk's rows uploaded and no marker, the rerun makes the
    store of an uninterrupted local run, byte for byte once assembled;
    `open_embeddings` and `--merge` read it from the bucket. Two workers write
    shards into one prefix, and the same job runs into s3://."""
    import storage_servers
    from test_corpus import SETTINGS, WEIGHTS, corpus_lines

    import elmo_jax
    from elmo_jax.corpus import CorpusSettings, embed_corpus
    from elmo_jax.corpus.store import local_store, open_embeddings

    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    lines = corpus_lines()
    for name, part in (("a.txt", lines[:11]), ("b.txt", lines[11:])):
        (tmp_path / name).write_text("\n".join(part) + "\n", encoding="utf-8")
        paths.upload(str(tmp_path / name), f"{gs_bucket}/corpus/{name}")
    options = elmo_jax.ElmoOptions.from_json(os.path.join(os.path.dirname(WEIGHTS),
                                                          "options.json"))
    params = elmo_jax.load_weights(WEIGHTS, options)
    local = str(tmp_path / "local-store")
    embed_corpus(params, options, [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], local,
                 CorpusSettings(**SETTINGS))

    out = f"{gs_bucket}/store"
    args = ["--input", f"{gs_bucket}/corpus/*.txt", "--output", out, "--weights", WEIGHTS,
            "--max_length", "16", "--chunk_lines", "5", "--batch_tokens", "64", "--no_progress"]
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", _KILLED_INSIDE_CHUNK_2, *args], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 137, r.stderr[-2000:]
    shard = f"{out}/shard-00000-of-00001"
    assert [n for n in paths.listdir(shard) if n.endswith(".json")] == [
        "chunk-000000.json", "chunk-000001.json"]
    assert "chunk-000002.vectors.bin" in paths.listdir(shard)
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["chunks_resumed"] == 2
    assembled = local_store(out)
    want, got = _store_files(local), _store_files(assembled)
    want["store.json"] = got["store.json"] = b""  # its inputs' paths differ, by design
    assert got == want
    store = open_embeddings(out)
    assert len(store) == len(lines)
    reference = open_embeddings(local)
    for i in (0, 3, 9, len(lines) - 1):
        np.testing.assert_array_equal(store[i], reference[i])
    first = next(store.batches(4))
    np.testing.assert_array_equal(first["features"], next(reference.batches(4))["features"])

    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), "--merge", out,
                        "--output", f"{gs_bucket}/merged.hdf5"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import h5py

    with h5py.File(copies.local_copy(f"{gs_bucket}/merged.hdf5")) as fh:
        assert len(fh) == len(lines)
        np.testing.assert_array_equal(fh["9"][...], reference[9])
    # bilm-tf's stateful dump, read from and written to the bucket as locally
    for given, dump in ((str(tmp_path / "a.txt"), str(tmp_path / "stateful.hdf5")),
                        (f"{gs_bucket}/corpus/a.txt", f"{gs_bucket}/stateful.hdf5")):
        r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), "--stateful",
                            "--input", given, "--output", dump, "--weights", WEIGHTS,
                            "--no_progress"], cwd=tmp_path, capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    with h5py.File(tmp_path / "stateful.hdf5") as a, \
            h5py.File(copies.local_copy(f"{gs_bucket}/stateful.hdf5")) as b:
        assert sorted(a) == sorted(b) and len(a) == 11
        for k in a:
            np.testing.assert_array_equal(a[k][...], b[k][...])
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt", "cache", "local-store",
                                            "stateful.hdf5"]

    # two workers, one prefix; and the same job on S3
    two = f"{gs_bucket}/two"
    remote_files = [f"{gs_bucket}/corpus/a.txt", f"{gs_bucket}/corpus/b.txt"]
    for worker in (1, 0):
        embed_corpus(params, options, remote_files, two, CorpusSettings(**SETTINGS), worker, 2)
    on_s3 = storage_servers.new_bucket("s3") + "/store"
    embed_corpus(params, options, remote_files, on_s3, CorpusSettings(**SETTINGS))
    for other in (open_embeddings(two), open_embeddings(on_s3)):
        assert len(other) == len(lines)
        for i in range(len(lines)):
            np.testing.assert_array_equal(other[i], reference[i])


def test_the_storage_service_gone_mid_run_stops_it_with_a_line_and_the_same_command_resumes(
        tmp_path, gcs):
    """The storage service gone in the middle of a run (a proxy in front of
    the emulator refuses every connection), for longer than the writes are
    tried again (ELMO_JAX_STORAGE_RETRY_SECONDS, 2 here): the run ends with one
    error line and status 2, its last checkpoint whole; once the service is
    back, the same command resumes from that checkpoint and finishes."""
    import storage_servers

    proxy = storage_servers.Proxy(gcs.port)
    bucket = storage_servers.new_bucket("gs")
    data = write_grammar_corpus(tmp_path / "data")
    env = {**devices_env(1, compile_bound=True), **proxy.env(gcs),
           "ELMO_JAX_STORAGE_RETRY_SECONDS": "2"}
    cmd = _train_cmd(data["train.txt"], data["vocab.txt"], f"{bucket}/run", 100000, 5)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while len(_steps(f"{bucket}/run") if paths.exists(f"{bucket}/run/checkpoints") else []) < 2:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < 300
        time.sleep(0.2)
    proxy.down()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "run the same command again" in last, err[-3000:]
    kept = _steps(f"{bucket}/run")
    from elmo_jax.formats import checkpoints

    newest = checkpoints.latest_step(f"{bucket}/run")
    assert newest is not None and newest >= 5, kept
    proxy.up()
    r = subprocess.run(_train_cmd(data["train.txt"], data["vocab.txt"], f"{bucket}/run",
                                  newest + 10, 5), cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from the checkpoint of step {newest}" in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == newest + 10


# the corpus job, paused before chunk 2's first upload until the test has
# taken the storage service away (the file `go` appears)
_PAUSED_BEFORE_CHUNK_2 = """
import os, sys, time
from elmo_jax.corpus import shard_writers as store
finish = store.BucketShardWriter.finish_chunk
def finish_chunk(self, *a, **k):
    if len(self.markers) == 2 and not os.path.exists("go"):
        open("paused", "w").close()
        while not os.path.exists("go"):
            time.sleep(0.05)
    finish(self, *a, **k)
store.BucketShardWriter.finish_chunk = finish_chunk
from elmo_jax.cli import run_cli
from elmo_jax.cli import embed
run_cli(lambda: embed.main(sys.argv[1:]))
"""


def test_the_storage_service_gone_mid_corpus_job_is_one_line_and_the_rerun_resumes(
        tmp_path, gcs):
    """The corpus job into a gs:// store loses the service before chunk 2 is
    written: one error line and status 2 once the writes have been tried for
    ELMO_JAX_STORAGE_RETRY_SECONDS; once it is back, the same command resumes
    the 2 chunks done and makes the local job's store."""
    import storage_servers
    from test_corpus import SETTINGS, WEIGHTS, corpus_lines

    import elmo_jax
    from elmo_jax.corpus import CorpusSettings, embed_corpus
    from elmo_jax.corpus.store import open_embeddings

    proxy = storage_servers.Proxy(gcs.port)
    bucket = storage_servers.new_bucket("gs")
    lines = corpus_lines()
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = elmo_jax.ElmoOptions.from_json(os.path.join(os.path.dirname(WEIGHTS),
                                                          "options.json"))
    local = str(tmp_path / "local-store")
    embed_corpus(elmo_jax.load_weights(WEIGHTS, options), options, [str(tmp_path / "c.txt")],
                 local, CorpusSettings(**SETTINGS))
    out = f"{bucket}/store"
    args = ["--input", str(tmp_path / "c.txt"), "--output", out, "--weights", WEIGHTS,
            "--max_length", "16", "--chunk_lines", "5", "--batch_tokens", "64", "--no_progress"]
    env = dict(os.environ, PYTHONPATH=REPO, ELMO_JAX_STORAGE_RETRY_SECONDS="2",
               ELMO_JAX_CACHE=str(tmp_path / "cache"), **proxy.env(gcs))
    job = subprocess.Popen([sys.executable, "-c", _PAUSED_BEFORE_CHUNK_2, *args], cwd=tmp_path,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (tmp_path / "paused").exists():
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.time() - t0 < 300
        time.sleep(0.05)
    proxy.down()
    (tmp_path / "go").touch()
    _, err = job.communicate(timeout=300)
    assert job.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "the storage service failed" in last, err[-3000:]
    assert "run the same command again" in last
    assert "Traceback" not in err, err[-3000:]
    proxy.up()
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["chunks_resumed"] == 2
    store, reference = open_embeddings(out), open_embeddings(local)
    assert len(store) == len(reference) == len(lines)
    for i in range(len(lines)):
        np.testing.assert_array_equal(store[i], reference[i])


def test_every_path_argument_in_a_bucket_leaves_no_local_gs_folder(tmp_path, gs_bucket):
    """The commands' path arguments given as gs:// paths, one after another as
    a pod's user would: a vocabulary and a prepared corpus written to the
    bucket (`vocab --out`, `prepare --out`), a run trained from the prepared
    folder there (`--train_files`, `--vocab_file`, `--eval_files`,
    `--workdir`), fine-tuned from its export (`export --out`, `--init_from`),
    a corpus embedded with it (`embed --model --input --output`) and merged
    (`--merge`). Every command runs in an empty folder, which stays empty (no
    local `gs:` folder); the bucket's prepared corpus is, file for file, the
    one `prepare` writes locally."""
    local, remote = _upload_corpus(tmp_path, gs_bucket)
    cwd = tmp_path / "host"
    cwd.mkdir()
    env = devices_env(1, compile_bound=True)

    def run(*argv, script="train.py"):
        r = subprocess.run([sys.executable, os.path.join(REPO, script), *argv], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (argv, r.stderr[-3000:])
        return r.stdout

    b = gs_bucket
    run("vocab", "--train_files", remote["train"], "--out", f"{b}/vocab.txt")
    run("vocab", "--train_files", local["train"], "--out", str(tmp_path / "vocab.txt"))
    assert paths.read_text(f"{b}/vocab.txt") == (tmp_path / "vocab.txt").read_text()
    run("prepare", "--train_files", remote["train"], "--out", f"{b}/prepared")
    run("prepare", "--train_files", local["train"], "--out", str(tmp_path / "prepared"))
    for name in ("tokens.npy", "starts.npy", "lengths.npy", "spellings.txt"):
        assert paths.read_bytes(f"{b}/prepared/{name}") == (
            tmp_path / "prepared" / name).read_bytes(), name
    run(*_train_cmd(f"{b}/prepared", f"{b}/vocab.txt", f"{b}/run", 2)[2:],
        "--eval_files", remote["heldout"])
    assert sorted(_losses(f"{b}/run")) == [1, 2] and _steps(f"{b}/run") == [2]
    run("export", "--workdir", f"{b}/run", "--out", f"{b}/export")
    run(*_train_cmd(remote["train"], f"{b}/vocab.txt", f"{b}/tuned", 1)[2:],
        "--init_from", f"{b}/export")
    assert _steps(f"{b}/tuned") == [1]
    run("--model", f"{b}/export", "--input", remote["heldout"], "--output", f"{b}/store",
        "--no_progress", script="embed.py")
    run("--merge", f"{b}/store", "--output", f"{b}/vectors.hdf5", script="embed.py")
    assert paths.size(f"{b}/vectors.hdf5") > 0
    assert os.listdir(cwd) == []
