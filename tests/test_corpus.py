"""The corpus job and its store (`corpus.py`, `store.py`): equal to
`Elmo.embed_sentences`, resumable after a kill at a chunk boundary and inside
a chunk, the same over 2 workers or 8 devices, a full disk an error that a
rerun continues, bad UTF-8 named, `--merge` in bilm-tf's layout."""
import errno
import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import elmo_jax
from conftest import FIXTURES, REPO, devices_env
from elmo_jax.corpus import shard_writers
from elmo_jax.corpus import store as store_lib
from elmo_jax.corpus import CorpusSettings, embed_corpus
from elmo_jax.corpus.store import DiskFull, StoreError, open_embeddings

OPTIONS = os.path.join(FIXTURES, "options.json")
WEIGHTS = os.path.join(FIXTURES, "lm_weights.hdf5")
WORDS = "the bank of river I play piano every day naïve café 日本語 a long line .".split()
# one length bucket (16) and chunks of 5 lines: few programs, many chunks
SETTINGS = dict(max_length=16, chunk_lines=5, batch_tokens=64)


def corpus_lines(n=23, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        k = 0 if i % 7 == 3 else int(rng.integers(1, 12)) if i != 9 else 40  # blanks, a long line
        lines.append(" ".join(WORDS[j] for j in rng.integers(0, len(WORDS), k)))
    return lines


@pytest.fixture(scope="module")
def model():
    options = elmo_jax.ElmoOptions.from_json(OPTIONS)
    return options, elmo_jax.load_weights(WEIGHTS, options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two input files; the store of one uninterrupted run over them."""
    d = tmp_path_factory.mktemp("corpus")
    lines = corpus_lines()
    (d / "a.txt").write_text("\n".join(lines[:11]) + "\n", encoding="utf-8")
    (d / "b.txt").write_text("\n".join(lines[11:]), encoding="utf-8")  # no final newline
    return {"dir": d, "files": [str(d / "a.txt"), str(d / "b.txt")], "lines": lines}


@pytest.fixture(scope="module")
def reference_store(model, corpus, tmp_path_factory):
    options, params = model
    out = str(tmp_path_factory.mktemp("ref") / "store")
    summary = embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS))
    assert summary["lines"] == len(corpus["lines"]) and summary["devices"] == 1
    return out


def same_store(a, b):
    a, b = open_embeddings(a), open_embeddings(b)
    assert len(a) == len(b)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i], b[i])


def test_the_store_equals_embed_sentences(model, corpus, reference_store):
    options, params = model
    store = open_embeddings(reference_store)
    sentences = [line.split() for line in corpus["lines"]]
    want = elmo_jax.Elmo(params, options, max_length=16).embed_sentences(sentences)
    assert len(store) == len(sentences) == 23
    for i, w in enumerate(want):
        assert store[i].shape == w.shape == (3, len(sentences[i]), 32)
        np.testing.assert_allclose(store[i], w, atol=1e-5)
    assert [a.shape for a in store[2:5]] == [w.shape for w in want[2:5]]
    assert len(list(store)) == 23 and store[-1].shape == want[-1].shape
    with pytest.raises(IndexError, match="line 23 is out of range"):
        store[23]
    # a padded batch of stored rows, as downstream training reads them
    batch = next(store.batches(4, indices=[9, 3, 0]))
    assert batch["features"].shape == (4, 64, 3, 32) and batch["index"].tolist() == [9, 3, 0, -1]
    np.testing.assert_array_equal(batch["features"][0, :40], np.moveaxis(store[9], 0, 1))
    assert batch["mask"].sum(1).tolist() == [40, 0, len(sentences[0]), 0]


@pytest.mark.parametrize("kind", ["layer", "mix", "mean", "float16"])
def test_one_layer_the_mix_sentence_vectors_and_float16(model, corpus, tmp_path, kind):
    options, params = model
    sentences = [line.split() for line in corpus["lines"]]
    elmo = elmo_jax.Elmo(params, options, max_length=16)
    settings = {"layer": dict(output="layer", layer=2),
                "mix": dict(output="mix", mix_weights=(0.0, 1.0, 2.0), gamma=0.5),
                "mean": dict(output="mix", mix_weights=(0.0, 0.0, 0.0), sentence_vectors=True),
                "float16": dict(dtype="float16")}[kind]
    embed_corpus(params, options, corpus["files"], str(tmp_path / "s"),
                 CorpusSettings(**SETTINGS, **settings))
    store = open_embeddings(tmp_path / "s")
    if kind == "layer":
        want = [a[2] for a in elmo.embed_sentences(sentences)]
    elif kind == "mix":
        want = elmo.embed_sentences(sentences, output="mix", mix_weights=[0, 1, 2], gamma=0.5)
    elif kind == "mean":
        want = elmo.embed_sentences(sentences, output="mean")
    else:
        want = elmo.embed_sentences(sentences)
    for i, w in enumerate(want):
        assert store[i].shape == w.shape
        if kind == "float16":
            assert store[i].dtype == np.float16
            np.testing.assert_allclose(store[i].astype(np.float32), w, atol=2e-3, rtol=2e-3)
        else:
            np.testing.assert_allclose(store[i], w, atol=1e-5)
    vectors = os.path.join(store_lib.shard_dir(str(tmp_path / "s"), 0, 1), "vectors.bin")
    rows = sum(len(s) for s in sentences) if kind != "mean" else len(sentences)
    width = {"layer": 32, "mix": 32, "mean": 32, "float16": 3 * 32}[kind]
    itemsize = 2 if kind == "float16" else 4
    assert os.path.getsize(vectors) == rows * width * itemsize  # flat, no per-line overhead


def test_two_workers_make_the_same_store_as_one(model, corpus, reference_store, tmp_path):
    options, params = model
    out = str(tmp_path / "s")
    embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS), 1, 2)
    with pytest.raises(StoreError, match=r"shard\(s\) \[0\] of 2 have not completed"):
        open_embeddings(out)
    embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS), 0, 2)
    same_store(out, reference_store)
    # a worker of another job (another number of shards) is refused, not mixed in
    with pytest.raises(StoreError, match="num_shards: 2 -> 3"):
        embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS), 0, 3)


def test_a_rerun_that_differs_is_refused(model, corpus, reference_store, tmp_path):
    options, params = model
    out = str(tmp_path / "s")
    files = [str(tmp_path / "a.txt")]
    (tmp_path / "a.txt").write_text("one two\nthree\n")
    embed_corpus(params, options, files, out, CorpusSettings(**SETTINGS))
    with pytest.raises(StoreError, match="output: \"layers\" -> \"layer\""):
        embed_corpus(params, options, files, out, CorpusSettings(**SETTINGS, output="layer",
                                                                 layer=1))
    import jax

    leaves, tree = jax.tree.flatten(params)
    other = jax.tree.unflatten(tree, [leaves[0] + 1e-3] + leaves[1:])
    with pytest.raises(StoreError, match="model: "):
        embed_corpus(other, options, files, out, CorpusSettings(**SETTINGS))
    with open(files[0], "a") as fh:
        fh.write("four\n")
    with pytest.raises(StoreError, match=r"inputs: .*a.txt \(14 bytes.* -> .*a.txt \(19 bytes"):
        embed_corpus(params, options, files, out, CorpusSettings(**SETTINGS))


KILLER = textwrap.dedent("""
    import os, sys
    from elmo_jax.corpus import shard_writers as store
    where = sys.argv.pop(1)
    append, finish = store.ShardWriter.append_rows, store.ShardWriter.finish_chunk
    def append_rows(self, rows):
        if where == "inside" and len(self.markers) == 2:  # half a batch of chunk 2, then death
            append(self, rows[:len(rows) // 2])
            self._files["vectors.bin"].flush()
            os._exit(137)
        append(self, rows)
    def finish_chunk(self, *a, **k):
        finish(self, *a, **k)
        if where == "boundary" and len(self.markers) == 2:  # just after chunk 1's marker
            os._exit(137)
    store.ShardWriter.append_rows, store.ShardWriter.finish_chunk = append_rows, finish_chunk
    from elmo_jax.cli import embed
    embed.main(sys.argv[1:])
""")


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["boundary", "inside"])
def test_a_killed_run_resumes_to_the_same_store(corpus, reference_store, tmp_path, where):
    """A process that dies at a chunk boundary (just after a marker) or in the
    middle of a chunk (half a batch written): the rerun cuts the partial chunk
    away, redoes it and writes a store equal, bit for bit, to an
    uninterrupted run's."""
    out = str(tmp_path / "s")
    args = ["--input", str(corpus["dir"] / "*.txt"), "--output", out, "--weights", WEIGHTS,
            "--max_length", "16", "--chunk_lines", "5", "--batch_tokens", "64",
            "--no_progress"]
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    r = subprocess.run([sys.executable, str(script), where, *args], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 137, r.stderr[-2000:]
    shard = store_lib.shard_dir(out, 0, 1)
    markers = sorted(f for f in os.listdir(shard) if f.startswith("chunk-"))
    assert markers == ["chunk-000000.json", "chunk-000001.json"]
    assert not os.path.exists(os.path.join(shard, "done.json"))
    if where == "inside":  # rows of the chunk in flight are on disk
        last = json.load(open(os.path.join(shard, markers[-1])))
        assert os.path.getsize(os.path.join(shard, "vectors.bin")) > last["rows"] * 3 * 32 * 4
    open(os.path.join(shard, ".vectors.bin.x.tmp"), "w").close()  # a leftover
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["chunks_resumed"] == 2 and summary["lines"] == 23
    assert not [f for f in os.listdir(shard) if f.endswith(".tmp")]
    same_store(out, reference_store)


def test_a_full_disk_is_an_error_and_the_rerun_continues(model, corpus, reference_store,
                                                         tmp_path, monkeypatch):
    options, params = model
    out = str(tmp_path / "s")
    original = shard_writers.ShardWriter.append_rows

    class FullDisk:  # the vectors file once the disk is full: writes fail, the rest works
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def append_rows(self, rows):
        if len(self.markers) == 2 and not isinstance(self._files["vectors.bin"], FullDisk):
            self._files["vectors.bin"] = FullDisk(self._files["vectors.bin"])
        return original(self, rows)

    monkeypatch.setattr(shard_writers.ShardWriter, "append_rows", append_rows)
    with pytest.raises(DiskFull) as e:
        embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS))
    message = str(e.value)
    assert "no space left on the device of" in message and "vectors.bin" in message
    assert "needs at least" in message and "the 2 finished chunk(s)" in message
    monkeypatch.setattr(shard_writers.ShardWriter, "append_rows", original)
    shard = store_lib.shard_dir(out, 0, 1)
    assert os.path.getsize(os.path.join(shard, "starts.bin")) == 10 * 8  # cut back to 2 chunks
    summary = embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS))
    assert summary["chunks_resumed"] == 2
    same_store(out, reference_store)


def test_bad_utf8_names_the_file_and_line_or_is_skipped(model, tmp_path):
    options, params = model
    f = tmp_path / "bad.txt"
    f.write_bytes(b"good line\nother line\nbad \xff line\nlast\n")
    from elmo_jax.data import DataError

    with pytest.raises(DataError, match=r"bad.txt, line 3: not valid UTF-8 \(byte 0xff at "
                                        r"column 5\)"):
        embed_corpus(params, options, [str(f)], str(tmp_path / "s"), CorpusSettings(**SETTINGS))
    out = str(tmp_path / "skip")
    embed_corpus(params, options, [str(f)], out, CorpusSettings(**SETTINGS, on_bad_line="skip"))
    store = open_embeddings(out)
    assert len(store) == 4 and store[2].shape == (3, 0, 32) and store[3].shape == (3, 1, 32)
    assert store.skipped == [{"line": 2, "file": str(f), "file_line": 3}]


def test_an_empty_corpus_is_an_empty_store(model, tmp_path):
    options, params = model
    (tmp_path / "empty.txt").write_text("")
    summary = embed_corpus(params, options, [str(tmp_path / "empty.txt")], str(tmp_path / "s"),
                           CorpusSettings(**SETTINGS))
    assert summary["lines"] == 0 and len(open_embeddings(tmp_path / "s")) == 0


@pytest.mark.e2e
def test_merge_writes_bilm_tfs_layout_and_hdf5_output_resumes(corpus, reference_store,
                                                             tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), "--merge",
                        reference_store, "--output", str(tmp_path / "m.hdf5")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    store = open_embeddings(reference_store)
    with h5py.File(tmp_path / "m.hdf5") as fh:
        assert sorted(fh, key=int) == [str(i) for i in range(23)]
        for i in range(23):
            np.testing.assert_array_equal(fh[str(i)][...], store[i])
    r = subprocess.run([sys.executable, os.path.join(REPO, "embed.py"), "--input",
                        str(corpus["dir"] / "*.txt"), "--output", str(tmp_path / "s"),
                        "--weights", WEIGHTS, "--stateful"], capture_output=True, text=True)
    assert r.returncode == 2 and "--stateful carries the state across lines" in r.stderr


@pytest.mark.e2e
def test_eight_devices_make_the_same_store_as_one(corpus, reference_store, tmp_path):
    """Each batch's rows are split over the 8 devices (1/8 each), and the
    store equals the one-device store."""
    script = textwrap.dedent(f"""
        import json, jax, numpy as np, elmo_jax
        from elmo_jax.corpus import CorpusSettings, Programs, Speller, embed_corpus, read_chunks
        from elmo_jax.corpus import batch_shapes, pieces_of, plan_batches
        options = elmo_jax.ElmoOptions.from_json({OPTIONS!r})
        params = elmo_jax.load_weights({WEIGHTS!r}, options)
        settings = CorpusSettings(**{SETTINGS!r})
        summary = embed_corpus(params, options, {corpus["files"]!r}, {str(tmp_path / "s")!r},
                               settings)
        shapes = batch_shapes(64, 16, 8)
        chunk = next(read_chunks({corpus["files"]!r}, 5, lambda c: True))
        shape, pieces = plan_batches(pieces_of(chunk, 16), shapes)[0]
        placed = Programs(params, options, settings, jax.local_devices(), shapes).place(
            Speller(options).batch(chunk, pieces, shape))
        rows = sorted({{s.data.shape[0] for s in placed[0].addressable_shards}})
        print(json.dumps({{"devices": summary["devices"], "rows": rows, "of": shape[0],
                          "holders": len(placed[0].addressable_shards)}}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(devices_env(8), PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"devices": 8, "rows": [got["of"] // 8], "of": got["of"], "holders": 8}
    store, ref = open_embeddings(tmp_path / "s"), open_embeddings(reference_store)
    for i in range(len(ref)):
        np.testing.assert_allclose(store[i], ref[i], atol=1e-6)


@pytest.mark.e2e
def test_a_real_full_disk_exits_with_an_error_and_the_rerun_continues(corpus, reference_store,
                                                                      tmp_path):
    """On a tmpfs too small for the store: exit status 2 and one error line (no
    crash, no traceback), finished chunks kept; with more space the same
    command finishes the store. Mounting needs root, as CI runs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(disk)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        args = [sys.executable, os.path.join(REPO, "embed.py"), "--input",
                str(corpus["dir"] / "*.txt"), "--output", str(disk / "s"), "--weights",
                WEIGHTS, "--max_length", "16", "--chunk_lines", "5", "--batch_tokens", "64",
                "--no_progress"]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 2, r.stderr[-3000:]
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: no space left on the device of ") and "MiB" in last
        assert "Traceback" not in r.stderr
        shard = store_lib.shard_dir(str(disk / "s"), 0, 1)
        kept = [f for f in os.listdir(shard) if f.startswith("chunk-")]
        assert 1 <= len(kept) < 5
        subprocess.run(["mount", "-o", "remount,size=1m", str(disk)], check=True)
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1])["chunks_resumed"] == len(kept)
        same_store(str(disk / "s"), reference_store)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


_HOLDS_SHARD_0 = """
import os, sys, time
from elmo_jax.corpus import shard_writers as store
finish = store.ShardWriter.finish_chunk
def finish_chunk(self, *a, **k):
    finish(self, *a, **k)
    if len(self.markers) == 1:  # one chunk done: hold the shard until killed
        open(sys.argv[1], "w").close()
        time.sleep(600)
store.ShardWriter.finish_chunk = finish_chunk
from elmo_jax.cli import embed
embed.main(sys.argv[2:])
"""


def test_a_shard_is_written_by_one_worker_at_a_time(model, corpus, reference_store,
                                                   tmp_path):
    """A second worker given the same shard while the first writes it is
    refused, naming the first; after the first is killed (kill -9) it takes
    the shard over, resumes its chunk, and the store is the reference's."""
    import signal
    import time

    options, params = model
    out, held = str(tmp_path / "s"), str(tmp_path / "held")
    args = ["--input", str(corpus["dir"] / "*.txt"), "--output", out, "--weights", WEIGHTS,
            "--max_length", "16", "--chunk_lines", "5", "--batch_tokens", "64",
            "--no_progress"]
    first = subprocess.Popen([sys.executable, "-c", _HOLDS_SHARD_0, held, *args],
                             env=dict(os.environ, PYTHONPATH=REPO), stderr=subprocess.PIPE,
                             text=True)
    t0 = time.time()
    while not os.path.exists(held):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.time() - t0 < 120
        time.sleep(0.05)
    try:
        with pytest.raises(StoreError, match=rf"shard 0 of 1 of .* is being written by pid "
                           rf"{first.pid} on .*once that worker ends, or is killed"):
            embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS))
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    summary = embed_corpus(params, options, corpus["files"], out, CorpusSettings(**SETTINGS))
    assert summary["chunks_resumed"] == 1
    same_store(out, reference_store)
    assert LOCK not in os.listdir(store_lib.shard_dir(out, 0, 1))


LOCK = shard_writers.LOCK_FILE


def test_workers_starting_together_share_one_spec_and_never_overwrite_it(model, corpus,
                                                                        tmp_path, monkeypatch):
    """The first worker's spec half-written (its temporary file there) is not
    "a folder that is not empty" to the second; and a spec written by another
    worker between the check and the write is compared, never replaced."""
    from elmo_jax.storage import paths

    options, params = model
    out = tmp_path / "s"
    out.mkdir()
    (out / f".{store_lib.SPEC_FILE}.abc123.tmp").write_text("{")  # worker 1, mid-write
    embed_corpus(params, options, corpus["files"][:1], str(out), CorpusSettings(**SETTINGS))
    other = tmp_path / "t"
    other.mkdir()
    real = paths.create_exclusively

    def another_worker_first(path, text):  # a spec of other settings lands first
        real(path, text.replace('"chunk_lines": 5', '"chunk_lines": 7'))
        return real(path, text)

    monkeypatch.setattr(store_lib, "create_exclusively", another_worker_first)
    with pytest.raises(StoreError, match="holds a store made differently.*chunk_lines: 7 -> 5"):
        embed_corpus(params, options, corpus["files"][:1], str(other), CorpusSettings(**SETTINGS))
    assert '"chunk_lines": 7' in (other / store_lib.SPEC_FILE).read_text()


def test_in_a_bucket_a_spec_another_worker_wrote_first_is_compared_never_replaced(
        model, corpus, bucket, monkeypatch):
    """The same race in a bucket, where the service is what refuses the
    second spec (`paths.create_new`): the job of other settings stops."""
    from elmo_jax.storage import paths

    options, params = model
    out = paths.join(bucket, "store")
    real = paths.create_exclusively

    def another_worker_first(path, text):
        real(path, text.replace('"chunk_lines": 5', '"chunk_lines": 7'))
        return real(path, text)

    monkeypatch.setattr(store_lib, "create_exclusively", another_worker_first)
    with pytest.raises(StoreError, match="holds a store made differently.*chunk_lines: 7 -> 5"):
        embed_corpus(params, options, corpus["files"][:1], out, CorpusSettings(**SETTINGS))
    assert '"chunk_lines": 7' in paths.read_text(paths.join(out, store_lib.SPEC_FILE))
