"""Paths in buckets (`elmo_jax.storage.paths`) against real storage servers on
127.0.0.1: fake-gcs-server and moto's S3 (`storage_servers`)."""
import os

import pytest

from elmo_jax import errors
from elmo_jax.storage import copies, files, paths
@pytest.mark.parametrize("bad, says", [
    ("hdfs://cluster/corpus/*.txt", "not hdfs://"),
    ("gs:/my-bucket/run", "two slashes"),
    ("s3://B/run", "not a bucket name"),
    ("gs:///run", "not a bucket name"),
    ("http://example.com/x.txt", "not http://"),
])
def test_a_path_nobody_can_open_is_one_error_before_anything_is_touched(bad, says):
    with pytest.raises(errors.PathError, match=says):
        paths.check(bad)
    with pytest.raises(errors.PathError):
        files.write_text(bad, "x")


def test_a_local_path_is_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.check("~/a/b.txt") == os.path.join(str(tmp_path), "a/b.txt")
    assert paths.check(f"file://{tmp_path}/x") == f"{tmp_path}/x"
    for local in ("runs/x", "C:/x", "weights:v1.hdf5", "hdfs:/x"):  # a colon, no "://"
        assert not paths.is_remote(local) and paths.check(local) == local
    files.write_text(tmp_path / "x.txt", "hello\n")
    assert paths.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "x.txt")]
    assert copies.local_copy(str(tmp_path / "x.txt")) == str(tmp_path / "x.txt")


def test_write_read_glob_and_list_in_a_bucket(bucket):
    run = paths.join(bucket, "run")
    assert not paths.exists(run) and paths.listdir(run) == []
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        files.write_text(paths.join(run, name), f"{name}\n")
    files.write_json(paths.join(run, "config.json"), {"x": 1})
    assert paths.glob(paths.join(run, "*.txt")) == [f"{run}/a.txt", f"{run}/b.txt"]
    assert paths.listdir(run) == ["a.txt", "b.txt", "config.json", "sub"]
    assert paths.isdir(paths.join(run, "sub")) and paths.isfile(paths.join(run, "a.txt"))
    assert files.read_json(paths.join(run, "config.json"), "config") == {"x": 1}
    with pytest.raises(FileNotFoundError, match="config not found"):
        files.read_json(paths.join(run, "missing.json"), "config")


def test_of_writers_racing_to_create_one_object_exactly_one_does(bucket):
    """`paths.create_exclusively` in a bucket: the service refuses every
    writer but one (a store's spec, written by each worker of a job)."""
    import concurrent.futures

    target = paths.join(bucket, "store", "store.json")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        won = list(pool.map(lambda i: paths.create_exclusively(target, f"writer {i}\n"),
                            range(6)))
    assert won.count(True) == 1, won
    assert paths.read_text(target) == f"writer {won.index(True)}\n"
    assert not paths.create_exclusively(target, "late\n")
    assert paths.read_text(target) == f"writer {won.index(True)}\n"


def test_a_failed_write_leaves_no_object(bucket):
    target = paths.join(bucket, "half.txt")
    with pytest.raises(RuntimeError):
        with paths.atomic_path(target) as tmp:
            with open(tmp, "w") as fh:
                fh.write("half")
            raise RuntimeError("killed")
    assert not paths.exists(target)


def test_a_local_copy_is_made_once_and_again_when_the_object_changes(bucket, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    obj = paths.join(bucket, "vocab.txt")
    files.write_text(obj, "one\n")
    first = copies.local_copy(obj)
    assert first.startswith(str(tmp_path / "cache")) and open(first).read() == "one\n"
    assert copies.local_copy(obj) == first
    files.write_text(obj, "two\n")
    second = copies.local_copy(obj)
    assert second != first and open(second).read() == "two\n"


def test_a_local_copy_of_a_prefix_is_one_listing_and_new_when_an_object_changes(
        bucket, tmp_path, monkeypatch):
    """`local_copy_tree`: the objects under a prefix in one local folder, each
    downloaded by the identity its listing gave (no request per object to
    ask it again), made again when any object changes."""
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    prefix = paths.join(bucket, "export")
    for name, text in (("options.json", "{}"), ("weights.hdf5", "w1"), ("sub/vocab.txt", "v")):
        files.write_text(paths.join(prefix, name), text)

    def asked_again(path):
        raise AssertionError(f"asked {path}'s identity again")

    with monkeypatch.context() as m:
        m.setattr(paths, "identity", asked_again)
        first = copies.local_copy_tree(prefix)
    got = {os.path.relpath(os.path.join(d, f), first): open(os.path.join(d, f)).read()
           for d, _, names in os.walk(first) for f in names}
    assert got == {"options.json": "{}", "weights.hdf5": "w1", "sub/vocab.txt": "v"}
    assert copies.local_copy_tree(prefix) == first
    files.write_text(paths.join(prefix, "weights.hdf5"), "w2")
    second = copies.local_copy_tree(prefix)
    assert second != first and open(os.path.join(second, "weights.hdf5")).read() == "w2"


def test_a_bucket_that_does_not_exist_is_named(bucket):
    missing = bucket.split("://")[0] + "://no-such-bucket-elmo-jax/run"
    with pytest.raises(errors.StorageError, match="bucket no-such-bucket-elmo-jax of .* does not exist"):
        paths.exists(missing)
    with pytest.raises(errors.StorageError, match="does not exist"):
        paths.glob(missing + "/*.txt")


# each refusal in a fresh process: fsspec keeps one client a process, made
# with the endpoint and credentials of the environment it was made in
_EACH_REFUSAL = """
import json, sys
from elmo_jax import errors
from elmo_jax.storage import paths
for path in sys.argv[1:]:
    for what, call in (("read", lambda: paths.exists(path)),
                       ("write", lambda: paths.write_bytes(path, b"x"))):
        try:
            call()
            print(json.dumps([what, "ok"]))
        except errors.StorageError as e:
            print(json.dumps([what, str(e), e.transient]))
"""


def _refusals(env: dict, *objects: str) -> list:
    import json
    import subprocess
    import sys

    env = dict(os.environ, ELMO_JAX_STORAGE_RETRY_SECONDS="0", **env)
    r = subprocess.run([sys.executable, "-c", _EACH_REFUSAL, *objects], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("status, reason, message, says", [
    (401, "required", "Anonymous caller does not have storage.objects.create access to the "
     "Google Cloud Storage object.", "no credentials for gs://b-1/x: set "
     "GOOGLE_APPLICATION_CREDENTIALS"),
    (403, "forbidden", "elmo@p.iam.gserviceaccount.com does not have storage.objects.create "
     "access", "no permission for gs://b-1/x .*give this machine's account access to the "
     "bucket b-1"),
    (403, "quotaExceeded", "The project has exceeded its storage quota.",
     "the storage quota is exhausted .*exceeded its storage quota.*the same command goes on"),
])
def test_what_gcs_refuses_is_one_line_that_says_what_to_do(status, reason, message, says):
    """GCS's refusals as GCS words them (a server on 127.0.0.1 answering each
    request so): none is retried, each is one line naming what to do."""
    import re

    import storage_servers

    server = storage_servers.RefusingGCS()
    try:
        server.answer(status, reason, message)
        got = _refusals({"STORAGE_EMULATOR_HOST": server.url}, "gs://b-1/x")
    finally:
        server.close()
    assert [g[0] for g in got] == ["read", "write"]
    for _, line, transient in got:
        assert re.search(says, line), line
        assert transient is False


def test_s3_without_credentials_with_refused_ones_and_without_permission():
    """moto's S3 server checking credentials: none set, keys it does not
    know, and a user who may read but not write, each one line."""
    import storage_servers

    server = storage_servers.S3WithAuth()
    try:
        reader = server.reader_env()
        none = {k: "" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        none.update(AWS_ENDPOINT_URL=server.url, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                    AWS_CONFIG_FILE=os.devnull)
        without = _refusals(none, "s3://locked/x")
        refused = _refusals(dict(reader, AWS_ACCESS_KEY_ID="AKIAUNKNOWN"), "s3://locked/x")
        readonly = _refusals(reader, "s3://locked/x")
    finally:
        server.close()
    assert all("no credentials for s3://locked/x: set AWS_ACCESS_KEY_ID" in g[1]
               for g in without), without
    # S3 answers a HEAD (exists) with a bare 403: refused keys read as "no permission"
    assert refused[0][1].startswith("no permission for s3://locked/x"), refused
    assert refused[1][1].startswith("the credentials for s3://locked/x were refused (The AWS "
                                    "Access Key Id you provided does not exist"), refused
    assert readonly[0] == ["read", "ok"]
    assert readonly[1][0] == "write" and readonly[1][1].startswith(
        "no permission for s3://locked/x (Access Denied)"), readonly
