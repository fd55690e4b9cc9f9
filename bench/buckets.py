"""Paths in a bucket against the local disk, in one run: checkpoint saves and
restores, reading a corpus, the corpus job into a store, random reads from a
store. The bucket is fake-gcs-server on 127.0.0.1 (tests/storage_servers.py),
on the same 2 cores as the job: it shows what elmo-jax adds (uploads whole,
local copies, the assembled store), not a real bucket's latency or request
limits.

    python -m bench.buckets [--configs bilm-tf-small,original] [--repeats 3]
        [--corpus-mb 50] [--lines 2000] [--json-out bench/results/buckets.json]

- checkpoint: orbax's save and restore (`checkpoints.manager`, synchronous) of
  a state of the config's biLM shapes, twice over (the parameters and an
  Adagrad accumulator each) plus a 10,000-word softmax, random float32.
- corpus: `TokenCorpus.from_files` over 8 shards of `--corpus-mb` MB in all:
  from the bucket with an empty local cache (listing, downloads eight at a
  time, then the same parse), from the bucket with the copies cached, and
  from the local disk.
- store: `embed_corpus` of the bilm-tf fixture model over `--lines` lines into
  a local store and into a bucket store (tokens/s from the first batch, as the
  job reports it); then 1,000 random `store[i]` from each (the bucket's store
  assembled into the local cache first: that time is reported on its own).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench import _common

REPO = _common.REPO


def _servers():
    sys.path.insert(0, os.path.join(REPO, "tests"))
    import storage_servers

    server = storage_servers.GCS()
    os.environ.update({**storage_servers.COMMON_ENV, **server.env()})
    return server, storage_servers


def _state(config_name: str):
    import numpy as np

    from elmo_jax.formats.weights import datasets_to_params, expected_shapes

    options = _common.load_config(config_name).model
    rng = np.random.default_rng(0)
    params = datasets_to_params({k: rng.standard_normal(s).astype(np.float32)
                                 for k, s in expected_shapes(options).items()}, options)
    dim = options.lstm.projection_dim
    softmax = {"w": rng.standard_normal((10000, dim)).astype(np.float32),
               "b": np.zeros(10000, np.float32)}
    import jax

    tree = {"params": {"bilm": params, "softmax": softmax}}
    tree["accumulators"] = jax.tree.map(np.ones_like, tree["params"])
    size = sum(a.nbytes for a in jax.tree.leaves(tree))
    return tree, size


def bench_checkpoint(config_name: str, where: dict, repeats: int) -> dict:
    import jax
    import orbax.checkpoint as ocp

    from elmo_jax.formats import checkpoints

    tree, size = _state(config_name)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
    out = {"config": config_name, "mib": round(size / 2**20, 1)}
    for name, root in where.items():
        saves, restores = [], []
        for r in range(repeats):
            workdir = f"{root}/ckpt-{config_name}-{r}"
            mngr = checkpoints.manager(workdir, max_to_keep=2, asynchronous=False)
            t0 = time.perf_counter()
            mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(tree)), force=True)
            mngr.wait_until_finished()
            saves.append(time.perf_counter() - t0)
            mngr = checkpoints.manager(workdir, asynchronous=False)
            t0 = time.perf_counter()
            got = mngr.restore(1, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract)))
            jax.block_until_ready(got["state"])
            restores.append(time.perf_counter() - t0)
        out[name] = {"save_s": _spread(saves), "restore_s": _spread(restores)}
    return out


def _spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3), "n": len(xs)}


def _corpus_files(folder: str, mb: float) -> list[str]:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from conftest import grammar_sentences

    lines = [" ".join(s) for s in grammar_sentences(20000, 0)]
    text = "\n".join(lines) + "\n"
    per_shard = int(mb * 2**20 / 8)
    files = []
    for i in range(8):
        path = os.path.join(folder, f"train-{i:02d}.txt")
        with open(path, "w") as fh:
            written = 0
            while written < per_shard:
                fh.write(text)
                written += len(text)
        files.append(path)
    return files


def bench_corpus(bucket: str, mb: float, tmp: str) -> dict:
    from elmo_jax.storage import copies, paths
    from elmo_jax.data.streams import TokenCorpus

    local_dir = os.path.join(tmp, "corpus")
    os.makedirs(local_dir)
    files = _corpus_files(local_dir, mb)
    for f in files:
        paths.upload(f, f"{bucket}/corpus/{os.path.basename(f)}")
    size = sum(os.path.getsize(f) for f in files)
    out = {"mib": round(size / 2**20, 1)}
    for name, pattern, cold in (("local", os.path.join(local_dir, "train-*.txt"), False),
                                ("bucket, cold cache", f"{bucket}/corpus/train-*.txt", True),
                                ("bucket, cached", f"{bucket}/corpus/train-*.txt", False)):
        if cold:
            shutil.rmtree(copies.local_cache_dir(), ignore_errors=True)
        t0 = time.perf_counter()
        corpus = TokenCorpus.from_files(pattern)
        seconds = time.perf_counter() - t0
        tokens = int(corpus.lengths.sum())
        out[name] = {"seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds),
                     "mib_per_s": round(size / 2**20 / seconds, 1)}
    return out


def _store_model(name: str):
    """(options, params): the bilm-tf fixture's, or a config's network with
    random weights (`original`: the forward pass of the published model)."""
    import numpy as np

    import elmo_jax
    from elmo_jax.formats.weights import datasets_to_params, expected_shapes

    if name == "fixture":
        fixtures = os.path.join(REPO, "tests", "fixtures", "bilm-tf")
        options = elmo_jax.ElmoOptions.from_json(os.path.join(fixtures, "options.json"))
        return options, elmo_jax.load_weights(os.path.join(fixtures, "lm_weights.hdf5"),
                                              options)
    options = _common.load_config(name).model
    rng = np.random.default_rng(0)
    return options, datasets_to_params({k: (0.05 * rng.standard_normal(s)).astype(np.float32)
                                        for k, s in expected_shapes(options).items()}, options)


def bench_store(bucket: str, lines: int, tmp: str, model: str = "fixture") -> dict:
    import numpy as np

    from elmo_jax.corpus import CorpusSettings, embed_corpus
    from elmo_jax.corpus.store import local_store, open_embeddings

    options, params = _store_model(model)
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from conftest import grammar_sentences

    text = os.path.join(tmp, "lines.txt")
    with open(text, "w") as fh:
        fh.write("\n".join(" ".join(s) for s in grammar_sentences(lines, 3)) + "\n")
    settings = CorpusSettings(chunk_lines=256)
    out = {"lines": lines, "model": model}
    stores = {"local": os.path.join(tmp, f"store-{model}"), "bucket": f"{bucket}/store-{model}"}
    for name, where in stores.items():
        summary = embed_corpus(params, options, [text], where, settings)
        out[name] = {"tokens_per_s": summary["tokens_per_sec"], "seconds": summary["seconds"]}
    out["bucket_over_local"] = round(out["bucket"]["tokens_per_s"]
                                     / out["local"]["tokens_per_s"], 3)
    t0 = time.perf_counter()
    local_store(stores["bucket"], progress=False)
    out["bucket"]["assemble_s"] = round(time.perf_counter() - t0, 2)
    rng = np.random.default_rng(0)
    for name, where in stores.items():
        store = open_embeddings(where)
        idx = rng.integers(0, len(store), 1000)
        t0 = time.perf_counter()
        for i in idx:
            np.asarray(store[int(i)])
        out[name]["reads_1000_s"] = round(time.perf_counter() - t0, 3)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="bilm-tf-small,original")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--corpus-mb", type=float, default=50)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--store-models", default="fixture",
                    help="the corpus job's networks: fixture (bilm-tf's tiny one) and/or a "
                         "config's with random weights (original)")
    ap.add_argument("--only", choices=("checkpoint", "corpus", "store"), action="append",
                    help="run only these parts (default: all)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    _common.run_as_the_commands()
    server, storage_servers = _servers()
    tmp = tempfile.mkdtemp(prefix="bench-buckets-")
    os.environ["ELMO_JAX_CACHE"] = os.path.join(tmp, "cache")
    try:
        bucket = storage_servers.new_bucket("gs")
        where = {"local": os.path.join(tmp, "work"), "bucket": f"{bucket}/work"}
        parts = args.only or ("checkpoint", "corpus", "store")
        result = {"machine": _common.machine()}
        if "checkpoint" in parts:
            result["checkpoint"] = [bench_checkpoint(c, where, args.repeats)
                                    for c in args.configs.split(",")]
        if "corpus" in parts:
            result["corpus"] = bench_corpus(bucket, args.corpus_mb, tmp)
        if "store" in parts:
            result["store"] = [bench_store(bucket, args.lines, tmp, m)
                               for m in args.store_models.split(",")]
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    _common.write_json(args.json_out, result)


if __name__ == "__main__":
    main()
