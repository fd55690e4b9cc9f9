"""Paths in buckets (`elmo_jax.paths`) against real storage servers on
127.0.0.1: fake-gcs-server and moto's S3 (`storage_servers`)."""
import os

import pytest

from elmo_jax import files, paths


@pytest.mark.parametrize("bad, says", [
    ("hdfs://cluster/corpus/*.txt", "not hdfs://"),
    ("gs:/my-bucket/run", "two slashes"),
    ("s3://B/run", "not a bucket name"),
    ("gs:///run", "not a bucket name"),
    ("http://example.com/x.txt", "not http://"),
])
def test_a_path_nobody_can_open_is_one_error_before_anything_is_touched(bad, says):
    with pytest.raises(paths.PathError, match=says):
        paths.check(bad)
    with pytest.raises(paths.PathError):
        files.write_text(bad, "x")


def test_a_local_path_is_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.check("~/a/b.txt") == os.path.join(str(tmp_path), "a/b.txt")
    assert paths.check(f"file://{tmp_path}/x") == f"{tmp_path}/x"
    for local in ("runs/x", "C:/x", "weights:v1.hdf5", "hdfs:/x"):  # a colon, no "://"
        assert not paths.is_remote(local) and paths.check(local) == local
    files.write_text(tmp_path / "x.txt", "hello\n")
    assert paths.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "x.txt")]
    assert paths.local_copy(str(tmp_path / "x.txt")) == str(tmp_path / "x.txt")


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


def test_a_failed_write_leaves_no_object(bucket):
    target = paths.join(bucket, "half.txt")
    with pytest.raises(RuntimeError):
        with files.atomic_path(target) as tmp:
            with open(tmp, "w") as fh:
                fh.write("half")
            raise RuntimeError("killed")
    assert not paths.exists(target)


def test_a_local_copy_is_made_once_and_again_when_the_object_changes(bucket, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    obj = paths.join(bucket, "vocab.txt")
    files.write_text(obj, "one\n")
    first = paths.local_copy(obj)
    assert first.startswith(str(tmp_path / "cache")) and open(first).read() == "one\n"
    assert paths.local_copy(obj) == first
    files.write_text(obj, "two\n")
    second = paths.local_copy(obj)
    assert second != first and open(second).read() == "two\n"


def test_a_bucket_that_does_not_exist_is_named(bucket):
    missing = bucket.split("://")[0] + "://no-such-bucket-elmo-jax/run"
    with pytest.raises(paths.StorageError, match="bucket no-such-bucket-elmo-jax of .* does not exist"):
        paths.exists(missing)
    with pytest.raises(paths.StorageError, match="does not exist"):
        paths.glob(missing + "/*.txt")
