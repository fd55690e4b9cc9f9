"""Models by name and URL through a local HTTP server on 127.0.0.1 that serves
generated models under the registry's paths (ELMO_JAX_ENDPOINT): no test
reaches the internet. The server counts its requests, and can cut a response
short or answer 404."""
import http.server
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
from elmo_jax import hub, registry
from elmo_jax.options import ElmoOptions

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
    extra = (("vocab", SMALL.url("options").replace("options.json", "vocab.txt")),
             ("softmax", SMALL.url("options").replace("options.json", "softmax.hdf5")))
    monkeypatch.setitem(registry.REGISTRY, "small", registry.Published(
        **{**SMALL.__dict__, "files": SMALL.files + extra}))
    words = ["<S>", "</S>", "<UNK>", "the", "bank"]
    (server.models / "vocab.txt").write_text("\n".join(words) + "\n")
    from elmo_jax.weights import save_softmax

    save_softmax(server.models / "softmax.hdf5", {"w": np.ones((5, 8), np.float32),
                                                  "b": np.zeros(5, np.float32)})
    for role, url in extra:
        server.add(url, server.models / ("vocab.txt" if role == "vocab" else "softmax.hdf5"))
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
    assert not [f for f in os.listdir(folder) if f.endswith(".part")]
    server.cut.clear()
    assert open_model("small").kind == "export"


def test_a_404_a_wrong_digest_and_no_server_are_clear_errors(server, monkeypatch):
    with pytest.raises(hub.DownloadError, match=r"vectors.nlpl.eu/repository/11/136.zip.*404"):
        open_model("manylangs-ar")  # the mirror lacks it: the message names the real URL
    bad = registry.Published(**{**SMALL.__dict__, "sha256": "0" * 64})
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
    code = "from elmo_jax import hub; print(hub.resolve('small', progress=False)[0])"
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
