"""The corpus job: its stages joined by threads and bounded queues. A reader
thread reads chunks, plans and spells their batches and places them on the
devices ahead; the main thread dispatches the device program; a writer
thread reads the results back and publishes each chunk with its marker."""
from __future__ import annotations

import queue
import threading
import time
from typing import Sequence

import jax
import numpy as np

from elmo_jax.corpus.planning import Speller, batch_shapes, pieces_of, plan_batches
from elmo_jax.corpus.program import Programs
from elmo_jax.corpus.reading import read_chunks
from elmo_jax.corpus.settings import CorpusSettings, store_spec
from elmo_jax.corpus.writing import ChunkState, publish
from elmo_jax.core.options import ElmoOptions
from elmo_jax.corpus.shard_writers import ShardWriter, open_shard, shard_chunks
from elmo_jax.corpus.store import StoreError, claim, numpy_dtype

END = object()


class _Pipeline:
    """Threads joined by bounded queues; the first error stops them all."""

    def __init__(self):
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def put(self, q: queue.Queue, item) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def get(self, q: queue.Queue):
        while not self.stop.is_set():
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                pass
        return None

    def thread(self, fn, *args) -> threading.Thread:
        def run():
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                self.errors.append(e)
                self.stop.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def embed_corpus(params: dict, options: ElmoOptions, files: Sequence[str], directory: str,
                 settings: CorpusSettings = CorpusSettings(), shard: int = 0,
                 num_shards: int = 1, lexicon=None, devices=None, progress: bool = False
                 ) -> dict:
    """Embed a corpus into an embedding store (this worker's shard of it),
    resuming a killed run's store where it stopped.

    Args:
        params: the biLM's parameters.
        options: its `ElmoOptions`.
        files: the input files (local or in a bucket), read in order as one
            corpus, one sentence a line; line i becomes store[i].
        directory: the store (local or in a bucket).
        settings: what is stored and how (`CorpusSettings`).
        shard: this worker's shard: chunks c with c % num_shards == shard.
        num_shards: the job's workers.
        lexicon: the dictionaries of a model that spells tokens with them.
        devices: the devices to use (default: every local one).
        progress: show a progress bar.

    Returns:
        A summary: lines, rows, tokens, chunks (and those resumed),
        tokens_per_sec, seconds.
    """
    settings.check(options)
    if not 0 <= shard < num_shards:
        raise StoreError(f"--shard must be in 0..{num_shards - 1}, got {shard}")
    devices = list(devices or jax.local_devices())
    t0 = time.time()
    spec = store_spec(params, options, files, settings, num_shards)
    claim(directory, spec)
    row_bytes = int(np.prod(spec.row_shape)) * numpy_dtype(settings.dtype).itemsize
    writer = open_shard(directory, shard, num_shards, row_bytes)
    summary = {"output": directory, "shard": shard, "num_shards": num_shards,
               "devices": len(devices), "chunks_resumed": len(writer.finished)}
    try:
        if not writer.done:
            summary.update(_run(params, options, files, settings, shard, num_shards, lexicon,
                                devices, writer, progress, spec))
        totals = _totals(writer)
        if not writer.done:
            writer.finish(totals)
    finally:
        writer.close()
    summary.update(totals)
    summary["seconds"] = round(time.time() - t0, 2)
    return summary


def _totals(writer: ShardWriter) -> dict:
    last = writer.markers[-1] if writer.markers else {"rows": 0, "lines": 0}
    return {"lines": last["lines"], "rows": last["rows"], "chunks": len(writer.markers),
            "tokens": int(sum(m["tokens"] for m in writer.markers)),
            "skipped_lines": int(sum(len(m["skipped"]) for m in writer.markers))}


def _run(params, options, files, settings, shard, num_shards, lexicon, devices, writer,
         progress, spec) -> dict:
    """The stages of one run over this worker's unfinished chunks."""
    from tqdm import tqdm

    shapes = batch_shapes(settings.batch_tokens, settings.max_length,
                          int(np.lcm(8, len(devices))), settings.max_rows)
    t = time.time()
    programs = Programs(params, options, settings, devices, shapes)
    compile_s = time.time() - t
    finished = writer.finished
    wanted = lambda c: shard_chunks(c, shard, num_shards) and c not in finished  # noqa: E731
    bar = tqdm(total=int(sum(f["size"] for f in spec.inputs) / num_shards), unit="B",
               unit_scale=True, disable=not progress, smoothing=0.1,
               desc=f"shard {shard}/{num_shards}" if num_shards > 1 else "embed")
    pipe, counters = _Pipeline(), {"tokens": 0, "batches": 0, "t_first": None}
    placed_q, done_q = queue.Queue(maxsize=2), queue.Queue(maxsize=3)
    reader = pipe.thread(_read, pipe, placed_q, files, settings, wanted, shapes, programs,
                         Speller(options, lexicon))
    writer_thread = pipe.thread(_write, pipe, done_q, writer, settings, spec.row_shape, bar,
                                counters, progress)
    t_start = time.time()
    try:
        _dispatch(pipe, placed_q, done_q, programs, counters)
        writer_thread.join()
    finally:
        pipe.stop.set()
        reader.join()
        writer_thread.join()
        bar.close()
    if pipe.errors:
        raise pipe.errors[0]
    seconds = time.time() - t_start
    return {"batches": counters["batches"], "batch_shapes": [list(s) for s in shapes],
            "compile_seconds": round(compile_s, 2),
            "tokens_per_sec": round(counters["tokens"] / max(seconds, 1e-9), 1),
            "tokens_this_run": counters["tokens"]}


def _read(pipe, placed_q, files, settings, wanted, shapes, programs, speller) -> None:
    """The reader stage: chunks -> planned, spelled batches placed on the devices."""
    for chunk in read_chunks(files, settings.chunk_lines, wanted, settings.on_bad_line,
                             settings.tokenize):
        plan = plan_batches(pieces_of(chunk, settings.max_length), shapes)
        if not pipe.put(placed_q, ("chunk", chunk, len(plan))):
            return
        for shape, pieces in plan:
            placed = programs.place(speller.batch(chunk, pieces, shape))
            if not pipe.put(placed_q, ("batch", shape, pieces, placed)):
                return
    pipe.put(placed_q, END)


def _dispatch(pipe, placed_q, done_q, programs, counters) -> None:
    """The main thread's stage: each placed batch through its compiled program."""
    while True:
        item = pipe.get(placed_q)
        if item is None:
            return
        if item is END:
            pipe.put(done_q, END)
            return
        if item[0] == "batch":
            _, shape, pieces, placed = item
            with jax.profiler.TraceAnnotation("embed_batch"):  # bench/gpu.py's trace
                item = ("batch", pieces, programs(shape, placed))
            counters["batches"] += 1
        if not pipe.put(done_q, item):
            return


def _write(pipe, done_q, writer, settings, row_shape, bar, counters, progress) -> None:
    """The writer stage: results read back, gathered by chunk, published."""
    state, store_dtype = None, numpy_dtype(settings.dtype)
    while True:
        item = pipe.get(done_q)
        if item is None or item is END:
            return
        if item[0] == "chunk":
            state = ChunkState(item[1], row_shape, settings.sentence_vectors)
            if item[2] == 0:  # no batch: blank lines only
                publish(writer, state, store_dtype, bar)
            continue
        _, pieces, out = item
        counters["tokens"] += state.add(pieces, np.asarray(out), writer)
        counters["t_first"] = counters["t_first"] or time.time()
        bar.update(state.take_bytes())
        if progress:
            dt = max(time.time() - counters["t_first"], 1e-9)
            bar.set_postfix_str(f"{counters['tokens'] / dt:,.0f} tokens/s", refresh=False)
        if state.complete:
            publish(writer, state, store_dtype, bar)


def shard_of_process(shard: int | None, num_shards: int | None) -> tuple[int, int]:
    """(shard, num_shards): the given ones, or this process's place in a
    `jax.distributed` run."""
    if shard is not None or num_shards is not None:
        return shard or 0, num_shards or 1
    return jax.process_index(), jax.process_count()
