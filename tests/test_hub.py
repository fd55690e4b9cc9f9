"""Models by name and URL through a local HTTP server on 127.0.0.1 that serves
generated models under the registry's paths (ELMO_JAX_ENDPOINT): no test
reaches the internet. The server counts its requests, and can cut a response
short or answer 404."""
import dataclasses
import gzip
import hashlib
import http.server
import io
import tarfile
import json
import os
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest

from conftest import HERE, REPO, random_tf_datasets, tiny_options_dict, write_datasets
from elmo_jax import Elmo, open_model
from elmo_jax.formats import hub, registry
from elmo_jax.core.options import ElmoOptions

TINY_MANYLANGS = os.path.join(HERE, "fixtures", "manylangs", "tiny")
SMALL = registry.REGISTRY["small"]
SENTENCES = [["The", "bank", "closed", "."], ["Hello", "world"]]


class Server:
    """Files of `root` by URL path; `cut` paths are sent half, with the whole
    Content-Length; `delay` seconds before each body."""

    def __init__(self, root):
        self.root, self.requests, self.cut, self.delay = root, [], set(), 0.0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                path = os.path.join(server.root, self.path.lstrip("/"))
                if not os.path.isfile(path):
                    self.send_error(404)
                    return
                data = open(path, "rb").read()
                time.sleep(server.delay)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if self.path in server.cut else data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def path(self, url):
        return "/" + url.split("/", 3)[3]

    def add(self, url, source):
        dest = os.path.join(self.root, self.path(url).lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(source, "rb") as src, open(dest, "wb") as out:
            out.write(src.read())


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server holding a tiny model as the registry's "small" and the
    ELMoForManyLangs fixture as "manylangs-zht"; a fresh cache."""
    models = tmp_path / "models"
    models.mkdir()
    options = ElmoOptions.from_dict(tiny_options_dict())
    options.to_json(models / "options.json")
    write_datasets(models / "weights.hdf5", random_tf_datasets(options))
    with zipfile.ZipFile(models / "zht.zip", "w") as z:
        for name in os.listdir(TINY_MANYLANGS):
            z.write(os.path.join(TINY_MANYLANGS, name), f"zht.model/{name}")
    s = Server(str(tmp_path / "www"))
    s.add(SMALL.url("options"), models / "options.json")
    s.add(SMALL.url("weights"), models / "weights.hdf5")
    s.add(registry.REGISTRY["manylangs-zht"].url("archive"), models / "zht.zip")
    s.models = models
    monkeypatch.setenv("ELMO_JAX_ENDPOINT", s.url)
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    for var in ("ELMO_JAX_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    yield s
    s.httpd.shutdown()


def local_vectors(folder):
    return Elmo.from_pretrained(os.path.join(folder, "weights.hdf5")).embed_sentences(SENTENCES)


def test_by_name_then_from_the_cache_then_offline(server, monkeypatch):
    want = local_vectors(server.models)
    got = Elmo.from_pretrained("small").embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert len(server.requests) == 2  # options and weights, once each
    open_model("small")
    assert len(server.requests) == 2  # the cache: no request at all
    monkeypatch.setenv("ELMO_JAX_OFFLINE", "1")
    assert open_model("small").kind == "export"
    with pytest.raises(hub.DownloadError, match=r"offline.*medium.*_weights\.hdf5|offline.*"
                       r"2x2048_256"):
        open_model("medium")  # not in the cache: says which file is missing
    assert len(server.requests) == 2


def test_the_vocabulary_and_softmax_come_only_for_scoring(server, monkeypatch):
    """The original model's softmax is 1.6 GB: embedding never fetches it."""
    extra = (registry.File("vocab", (SMALL.url("options").replace("options.json", "vocab.txt"),)),
             registry.File("softmax", (SMALL.url("options").replace("options.json",
                                                                    "softmax.hdf5"),)))
    monkeypatch.setitem(registry.REGISTRY, "small",
                        dataclasses.replace(SMALL, files=SMALL.files + extra))
    words = ["<S>", "</S>", "<UNK>", "the", "bank"]
    (server.models / "vocab.txt").write_text("\n".join(words) + "\n")
    from elmo_jax.formats.weights import save_softmax

    save_softmax(server.models / "softmax.hdf5", {"w": np.ones((5, 8), np.float32),
                                                  "b": np.zeros(5, np.float32)})
    for f in extra:
        server.add(f.urls[0], server.models / ("vocab.txt" if f.role == "vocab" else "softmax.hdf5"))
    assert open_model("small").softmax is None and len(server.requests) == 2
    model = open_model("small", softmax=True)
    assert model.vocab.words == words and model.softmax["w"].shape == (5, 8)
    assert len(server.requests) == 4


def test_by_url_weights_with_options_and_an_archive(server):
    want = local_vectors(server.models)
    weights = server.url + server.path(SMALL.url("weights"))
    options = server.url + server.path(SMALL.url("options"))
    got = Elmo.from_pretrained(weights, options=options).embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    # an ELMoForManyLangs archive, by name (the NLPL repository's path, mirrored)
    elmo = Elmo.from_pretrained("manylangs-zht")
    sentences = json.load(open(os.path.join(TINY_MANYLANGS, "sentences.json")))
    import h5py

    with h5py.File(os.path.join(TINY_MANYLANGS, "expected.hdf5")) as fh:
        for i, v in enumerate(elmo.embed_sentences(sentences[:2])):
            assert np.abs(v - fh[str(i)][...]).max() <= 2e-5


def test_a_truncated_download_leaves_nothing_and_the_next_call_succeeds(server):
    server.cut.add(server.path(SMALL.url("weights")))
    with pytest.raises(hub.DownloadError, match=r"_weights\.hdf5.*(broke off|incomplete)"):
        open_model("small")
    folder = os.path.join(hub.cache_dir(), "models", "small")
    assert not os.path.exists(os.path.join(folder, "weights.hdf5"))
    assert not [f for f in os.listdir(folder) if f.endswith((".part", ".tmp"))]
    server.cut.clear()
    assert open_model("small").kind == "export"


def test_a_404_a_wrong_digest_and_no_server_are_clear_errors(server, monkeypatch):
    with pytest.raises(hub.DownloadError, match=r"vectors.nlpl.eu/repository/11/136.zip.*404"):
        open_model("manylangs-ar")  # the mirror lacks it: the message names the real URL
    weights = dataclasses.replace(SMALL.file("weights"), sha256="0" * 64)
    bad = dataclasses.replace(SMALL, files=(SMALL.file("options"), weights))
    monkeypatch.setitem(registry.REGISTRY, "small", bad)
    with pytest.raises(hub.DownloadError, match="sha256.*differs"):
        open_model("small")
    assert not os.path.exists(os.path.join(hub.cache_dir(), "models", "small", "weights.hdf5"))
    with pytest.raises(FileNotFoundError, match="elmo-jax models"):
        open_model("smal")
    monkeypatch.setenv("ELMO_JAX_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(hub.DownloadError, match=r"_options\.json: cannot reach.*ELMO_JAX_OFFLINE"):
        open_model("medium")


def test_two_processes_download_once(server):
    server.delay = 1.0  # both start before either finishes
    code = "from elmo_jax.formats import hub; print(hub.resolve('small', progress=False)[0])"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0][0] == outs[1][0]
    assert sorted(server.requests) == sorted([server.path(SMALL.url("options")),
                                              server.path(SMALL.url("weights"))])


def test_an_archive_that_escapes_its_folder_is_refused(tmp_path):
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../outside.txt", "x")
    with pytest.raises(hub.DownloadError, match="outside"):
        hub.extract_archive(str(evil), str(tmp_path / "out"))
    assert not (tmp_path / "outside.txt").exists()


# -- the registry true to its publishers: each layout served as published ------------


def test_an_allennlp_file_comes_from_its_second_url_when_the_first_is_gone(server):
    """AllenNLP's path-style S3 URL first, then the allennlp.s3.amazonaws.com form
    (the mirror maps each alternative at its own path)."""
    medium = registry.REGISTRY["medium"]
    for f, local in ((medium.file("options"), "options.json"),
                     (medium.file("weights"), "weights.hdf5")):
        assert f.urls[1].startswith("https://allennlp.s3.amazonaws.com/models/elmo/")
        assert f.urls[0].split("/models/elmo/")[1] == f.urls[1].split("/models/elmo/")[1]
        server.add(f.urls[1], server.models / local)
    got = Elmo.from_pretrained("medium").embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, local_vectors(server.models)))
    assert [server.path(u) for f in medium.files for u in f.urls] == server.requests


def _nlpl_zip(tmp_path):
    """A tiny bilm-tf model as the NLPL repository zips one: model.hdf5,
    options.json (n_characters 261, as bilm-tf trains) and vocab.txt.gz."""
    options = ElmoOptions.from_dict(tiny_options_dict())
    folder = tmp_path / "nlpl"
    folder.mkdir()
    write_datasets(folder / "model.hdf5", random_tf_datasets(options, seed=3))
    options.to_json(folder / "options.json")
    raw = json.load(open(folder / "options.json"))
    raw["char_cnn"]["n_characters"] = 261
    json.dump(raw, open(folder / "options.json", "w"))
    with gzip.open(folder / "vocab.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("<S>\n</S>\n<UNK>\nthe\nbank\n")
    zpath = tmp_path / "218.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for name in ("model.hdf5", "options.json", "vocab.txt.gz"):
            z.write(folder / name, name)
    return folder, zpath


def test_an_nlpl_archive_opens_by_name_url_zip_and_folder_with_the_same_vectors(server, tmp_path):
    folder, zpath = _nlpl_zip(tmp_path)
    entry = registry.REGISTRY["nlpl-218"]
    assert entry.file("archive").urls == ("http://vectors.nlpl.eu/repository/20/218.zip",
                                          "http://vectors.nlpl.eu/repository/11/218.zip")
    server.add(entry.file("archive").urls[1], zpath)  # only the older path answers
    want = Elmo.from_pretrained(str(folder)).embed_sentences(SENTENCES)
    model = open_model(str(folder))
    assert model.vocab.words[3:] == ["the", "bank"] and model.softmax is None
    for source in ("nlpl-218", str(zpath), server.url + server.path(entry.file("archive").urls[1])):
        got = Elmo.from_pretrained(source).embed_sentences(SENTENCES)
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), source


def _tar(path, folder, mode, top):
    with tarfile.open(path, mode) as t:
        for name in sorted(os.listdir(folder)):
            t.add(os.path.join(folder, name), f"{top}/{name}")


def test_manylangs_tar_bz2_by_name_and_its_dead_link_named(server, tmp_path):
    """manylangs-zhs as its README gives it (a .tar.bz2); when no URL answers, the
    error says the link is reported dead and where users found a copy."""
    with pytest.raises(hub.DownloadError, match=r"39\.96\.43\.154/zhs\.model\.tar\.bz2: HTTP 404"
                       r".*reported dead.*issue #106.*gnes-1252847528"):
        open_model("manylangs-zhs")
    _tar(tmp_path / "zhs.tar.bz2", TINY_MANYLANGS, "w:bz2", "zhs.model")
    server.add(registry.REGISTRY["manylangs-zhs"].url("archive"), tmp_path / "zhs.tar.bz2")
    got = Elmo.from_pretrained("manylangs-zhs").embed_sentences(SENTENCES)
    want = Elmo.from_pretrained(TINY_MANYLANGS).embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_model_in_parts_is_joined_and_checked_against_the_published_digests(server, tmp_path,
                                                                               monkeypatch):
    """The German model: four parts of a tgz, each with the README's MD5 and SHA-1,
    and the whole's. Served files that are not the published ones are refused
    (nothing kept); parts whose digests match are joined and open."""
    folder = tmp_path / "bilm-output-result"
    folder.mkdir()
    for name in ("options.json", "weights.hdf5"):
        (folder / name).write_bytes((server.models / name).read_bytes())
    (folder / "vocab-train.txt").write_text("<S>\n</S>\n<UNK>\nder\n")
    _tar(tmp_path / "de.tgz", folder, "w:gz", "bilm-output-result")
    data = (tmp_path / "de.tgz").read_bytes()
    cut = [0, len(data) // 4, len(data) // 2, 3 * len(data) // 4, len(data)]
    pieces = [data[a:b] for a, b in zip(cut, cut[1:])]
    published = registry.REGISTRY["de-tsystems"]
    archive = published.file("archive")
    assert [p.md5 for p in archive.parts][0] == "755379908885a6fa6fb5b68e4806eae0"
    for part, piece in zip(archive.parts, pieces):
        (tmp_path / "piece").write_bytes(piece)
        server.add(part.urls[0], tmp_path / "piece")
    with pytest.raises(hub.DownloadError, match=r"part-00: md5 [0-9a-f]{32} differs from the "
                       r"published 755379908885a6fa6fb5b68e4806eae0"):
        open_model("de-tsystems")
    assert not [f for f in os.listdir(os.path.join(hub.cache_dir(), "models", "de-tsystems"))
                if not f.endswith(".lock")]
    ours = dataclasses.replace(archive, md5=hashlib.md5(data).hexdigest(), sha1=hashlib.sha1(
        data).hexdigest(), parts=tuple(dataclasses.replace(
            p, md5=hashlib.md5(x).hexdigest(), sha1=hashlib.sha1(x).hexdigest())
            for p, x in zip(archive.parts, pieces)))
    monkeypatch.setitem(registry.REGISTRY, "de-tsystems",
                        dataclasses.replace(published, files=(ours,)))
    got = Elmo.from_pretrained("de-tsystems").embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, local_vectors(server.models)))
    cached = os.listdir(os.path.join(hub.cache_dir(), "models", "de-tsystems"))
    assert "archive.tgz" in cached and not [f for f in cached if ".part-" in f]
    bad_whole = dataclasses.replace(ours, md5="0" * 32)
    monkeypatch.setitem(registry.REGISTRY, "de-tsystems",
                        dataclasses.replace(published, files=(bad_whole,)))
    with pytest.raises(hub.DownloadError, match=r"joined\): md5 [0-9a-f]{32} differs"):
        hub.fetch_published(registry.REGISTRY["de-tsystems"], progress=False)


def test_the_transformer_elmo_is_listed_and_refused(server, tmp_path):
    with pytest.raises(hub.UnsupportedModel, match="another architecture"):
        open_model("transformer-elmo")
    (tmp_path / "in.txt").write_text("The bank .\n")
    r = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", "--model", "transformer-elmo",
                        "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.hdf5")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "error: transformer-elmo is not supported" in r.stderr, r.stderr
    assert server.requests == []


def test_every_entry_names_its_sources_and_the_site_s_table_is_the_command_s(
        tmp_path, monkeypatch, capsys):
    for m in registry.MODELS:
        assert m.sources and all(len(s) >= 3 and s[2] for s in m.sources), m.name
        urls = [u for f in m.files for u in f.urls or [x for p in f.parts for x in p.urls]]
        assert urls and all(u.startswith(("http://", "https://")) for u in urls), m.name
    assert registry.REGISTRY["original"].file("weights").size == 374_434_792
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "empty"))
    from elmo_jax.cli import models

    models.main([])
    table = capsys.readouterr().out.split("\n\ncache:")[0].strip("\n")
    assert all(m.name in table for m in registry.MODELS)
    # the site's table is this command's output, generated when the site is built
    import sys

    sys.path.insert(0, os.path.join(REPO, "docs", "_ext"))
    import registry_table

    assert registry_table.registry_table() == table
    guide = open(os.path.join(REPO, "docs", "guides", "models.md"), encoding="utf-8").read()
    assert "```{registry-table}" in guide
    models.main(["--details", "manylangs-zht"])
    shown = capsys.readouterr().out
    assert "HIT-SCIR" in shown and "ELMoForManyLangs README.md" in shown and "inferred" in shown


def test_a_cache_in_a_bucket_serves_hosts_that_share_no_disk(server, bucket, tmp_path,
                                                            monkeypatch):
    """ELMO_JAX_CACHE=gs://... (or s3://): the first host downloads and
    uploads each verified file; a host with an empty disk takes the bucket's
    copy (no request to the server), offline too; a copy in the bucket that is
    not what its record says is fetched again from the source."""
    from elmo_jax.storage import paths

    want = local_vectors(server.models)
    monkeypatch.setenv("ELMO_JAX_CACHE", f"{bucket}/cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-0"))
    assert hub.cache_dir() == str(tmp_path / "host-0" / "elmo-jax")
    assert open_model("small").kind == "export" and len(server.requests) == 2
    shared = f"{bucket}/cache/models/small"
    assert {"weights.hdf5", "weights.hdf5.sha256", "options.json"} <= set(paths.listdir(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-1"))
    monkeypatch.setenv("ELMO_JAX_OFFLINE", "1")
    got = Elmo.from_pretrained("small").embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert len(server.requests) == 2
    assert os.path.exists(tmp_path / "host-1" / "elmo-jax" / "models" / "small" / "weights.hdf5")
    monkeypatch.delenv("ELMO_JAX_OFFLINE")
    size = paths.size(f"{shared}/weights.hdf5")
    paths.write_bytes(f"{shared}/weights.hdf5", b"\0" * size)  # same size, other bytes
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-2"))
    got = Elmo.from_pretrained("small").embed_sentences(SENTENCES)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert server.requests[2:] == [server.path(SMALL.url("weights"))]
