"""Embed a corpus into a store (`store.py`): ELMo's feature-based use, built as
a batch-inference job (`elmo-jax embed --input 'corpus/*.txt' --output DIR`).

    lines of the input files, read as they go (memory bounded by one chunk)
      -> chunks of `chunk_lines` lines; chunk c is shard c % num_shards's
         (a worker does only its own, and skips the ones already finished)
      -> pieces (a line, or a window of a line longer than max_length),
         sorted by length within the chunk, batched into a few fixed
         (rows, length) shapes compiled before the first batch
      -> a reader thread spells each batch and places it on the devices
         ahead (rows split over every local device); the main thread
         dispatches one program, character ids to the stored rows
         (`corpus_program`); a writer thread reads the results back and
         appends them, publishing each chunk with its marker.

Every result of a chunk depends only on the chunk's lines, so a resumed run,
a run over other workers or over other devices writes the same rows.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import queue
import threading
import time
from typing import Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax import chars, paths
from elmo_jax.data.sources import DataError
from elmo_jax.elmo import windows
from elmo_jax.embedding import embed
from elmo_jax.embedding import mix_weights as normalized_mix
from elmo_jax.options import ElmoOptions
from elmo_jax.shapes import round_up
from elmo_jax.store import (ShardWriter, StoreError, StoreSpec, claim, numpy_dtype, open_shard,
                            shard_chunks)

OUTPUTS = ("layers", "layer", "mix")


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """How a corpus is embedded and stored (the `embed` command's flags)."""
    output: str = "layers"            # "layers" (all), "layer" (one), "mix"
    layer: int | None = None
    mix_weights: tuple | None = None  # raw scalars, softmax-normalised
    gamma: float = 1.0
    sentence_vectors: bool = False    # store each line's mean over its tokens
    dtype: str = "float32"            # stored: float32, float16, bfloat16
    compute_dtype: str = "float32"    # the matmuls' input dtype (bfloat16 on accelerators)
    batch_tokens: int = 4096          # rows x length of every batch shape
    max_rows: int | None = None       # at most this many rows a batch
    max_length: int = 512             # longer lines go in overlapping windows
    chunk_lines: int = 4096           # lines a chunk (the unit of resuming)
    tokenize: str | None = None       # None (pre-tokenised), "en" or "zh"
    on_bad_line: str = "error"        # a line that is not UTF-8: "error" or "skip"

    def check(self, options: ElmoOptions) -> None:
        K = options.n_output_layers
        if self.output not in OUTPUTS:
            raise StoreError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if self.output == "layer" and not (self.layer is not None and 0 <= self.layer < K):
            raise StoreError(f"--layer must be in 0..{K - 1}, got {self.layer}")
        if self.output == "mix" and (self.mix_weights is None or len(self.mix_weights) != K):
            raise StoreError(f"the mix needs {K} weights (one per layer), got "
                             f"{0 if self.mix_weights is None else len(self.mix_weights)}")
        numpy_dtype(self.dtype)
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise StoreError(f"compute_dtype must be float32 or bfloat16, got "
                             f"{self.compute_dtype!r}")
        for name in ("batch_tokens", "chunk_lines"):
            if getattr(self, name) < 1:
                raise StoreError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 8:
            raise StoreError(f"--max_length must be >= 8, got {self.max_length}")
        if self.on_bad_line not in ("error", "skip"):
            raise StoreError(f"--on_bad_line must be error or skip, got {self.on_bad_line!r}")

    def row_shape(self, options: ElmoOptions) -> tuple:
        W = options.output_dim
        return (options.n_output_layers, W) if self.output == "layers" else (W,)


def model_fingerprint(params: dict, options: ElmoOptions) -> str:
    """A digest of the options and every parameter's name, shape and bytes."""
    h = hashlib.sha256(json.dumps(options.to_dict(), sort_keys=True).encode())
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(params)[0],
                             key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def describe_inputs(files: Sequence[str]) -> list[dict]:
    out = []
    for f in files:
        if paths.is_remote(f):  # an object: its size and generation (or ETag)
            size, version = paths.version(f)
            out.append({"path": f, "size": size, "version": version})
            continue
        st = os.stat(f)
        out.append({"path": os.path.abspath(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


# ----------------------------------------------------------------------------
# lines and chunks


class Chunk(NamedTuple):
    index: int              # global chunk number
    first_line: int         # global number of its first line
    tokens: list            # [lines] token lists ([] for a blank or skipped line)
    line_bytes: list        # [lines] each line's input bytes (for the progress bar)
    skipped: list           # [{"line", "file", "file_line"}] lines that were not UTF-8


def read_chunks(files: Sequence[str], chunk_lines: int, wanted, on_bad_line: str = "error",
                tokenize: str | None = None) -> Iterator[Chunk]:
    """The chunks for which `wanted(c)` holds, decoded and split, in order;
    the others' lines are only counted. Lines end at "\\n" only (a "\\r"
    before it dropped), as `files.split_lines` reads them."""
    index, first, take = 0, 0, wanted(0)
    raw_lines, where, count = [], [], 0
    for path in files:
        with paths.open(path, "rb") as fh:  # a bucket's object streamed in blocks
            for n, raw in enumerate(fh, 1):
                count += 1
                if take:
                    raw_lines.append(raw)
                    where.append((path, n))
                if count == chunk_lines:
                    if take:
                        yield _decode(index, first, raw_lines, where, on_bad_line, tokenize)
                    index, first = index + 1, first + chunk_lines
                    raw_lines, where, count = [], [], 0
                    take = wanted(index)
    if take and count:
        yield _decode(index, first, raw_lines, where, on_bad_line, tokenize)


def _decode(index, first, raw_lines, where, on_bad_line, tokenize) -> Chunk:
    texts, skipped = [], []
    for k, raw in enumerate(raw_lines):
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            path, n = where[k]
            if on_bad_line == "error":
                raise DataError(f"{path}, line {n}: not valid UTF-8 (byte {raw[e.start]:#04x} "
                                f"at column {e.start + 1}); convert the file to UTF-8, or "
                                "pass --on_bad_line skip to store it as an empty line") from None
            skipped.append({"line": first + k, "file": path, "file_line": n})
            texts.append("")
    if tokenize:
        from elmo_jax.segmentation import tokenize_lines

        tokens = tokenize_lines(texts, lang=tokenize)
    else:
        tokens = [t.split() for t in texts]
    return Chunk(index, first, tokens, [len(r) for r in raw_lines], skipped)


# ----------------------------------------------------------------------------
# batches


class Piece(NamedTuple):
    line: int       # within the chunk
    start: int      # the window's first token in the line
    end: int
    keep: tuple     # (lo, hi) within the window: the tokens it gives the line
    part: int       # which window of the line, and how many it has
    parts: int


def batch_shapes(batch_tokens: int, max_length: int, row_multiple: int,
                 max_rows: int | None = None) -> list[tuple[int, int]]:
    """[(rows, length)], lengths 16, 32, ... up to max_length (rounded up to
    8), rows about batch_tokens / length in multiples of `row_multiple`."""
    lengths, T = [], 16
    while T < max_length:
        lengths.append(T)
        T *= 2
    lengths.append(round_up(max_length, 8))
    shapes = []
    for T in lengths:
        rows = max(row_multiple, (batch_tokens // T) // row_multiple * row_multiple)
        if max_rows:
            rows = min(rows, round_up(max_rows, row_multiple))
        shapes.append((rows, T))
    return shapes


def pieces_of(chunk: Chunk, max_length: int) -> list[Piece]:
    out = []
    for i, tokens in enumerate(chunk.tokens):
        if not tokens:
            continue
        spans = windows(len(tokens), max_length)
        for k, (a, b, ka, kb) in enumerate(spans):
            out.append(Piece(i, a, b, (ka - a, kb - a), k, len(spans)))
    return out


def plan_batches(pieces: Sequence[Piece], shapes) -> list[tuple[tuple, list[Piece]]]:
    """[(shape, pieces)]: pieces sorted by length (stably), each batch the
    next pieces that fit the smallest length that holds the first of them."""
    order = sorted(pieces, key=lambda p: p.end - p.start)
    batches, i = [], 0
    while i < len(order):
        n = order[i].end - order[i].start
        rows, T = next(s for s in shapes if s[1] >= n)
        j = i
        while j < len(order) and j - i < rows and order[j].end - order[j].start <= T:
            j += 1
        batches.append(((rows, T), order[i:j]))
        i = j
    return batches


class Speller:
    """Token -> its ids row, memoised (a corpus repeats its words)."""

    def __init__(self, options: ElmoOptions, lexicon=None, max_cached: int = 1 << 18):
        self.C = options.char_cnn.max_characters_per_token
        self.width = options.char_cnn.ids_per_token
        self.lexicon, self.max_cached, self.cache = lexicon, max_cached, {}

    def spell(self, token: str) -> np.ndarray:
        ids = self.cache.get(token)
        if ids is None:
            ids = (self.lexicon.token_ids(token, self.C) if self.lexicon is not None
                   else chars.token_to_char_ids(token, self.C)).astype(np.int16)
            if len(self.cache) >= self.max_cached:
                self.cache.clear()
            self.cache[token] = ids
        return ids

    def batch(self, chunk: Chunk, pieces: Sequence[Piece], shape) -> dict:
        rows, T = shape
        ids = np.zeros((rows, T, self.width), np.int16)
        lo = np.zeros(rows, np.int32)
        hi = np.zeros(rows, np.int32)
        for b, p in enumerate(pieces):
            toks = chunk.tokens[p.line][p.start:p.end]
            try:
                ids[b, :len(toks)] = [self.spell(t) for t in toks]
            except ValueError as e:
                raise DataError(f"line {chunk.first_line + p.line}: {e}") from None
            lo[b], hi[b] = p.keep
        return {"char_ids": ids, "keep_lo": lo, "keep_hi": hi}


# ----------------------------------------------------------------------------
# the device program


def corpus_program(params, char_ids, keep_lo, keep_hi, *, options: ElmoOptions,
                   settings: CorpusSettings):
    """Character ids [B, T, C] (int16) -> the stored rows of the batch, in one
    program: [B, T, *row_shape] in the stored dtype; with sentence vectors
    [B, *row_shape] float32, the sum over each row's kept tokens
    (keep_lo <= t < keep_hi; the host adds a line's windows and divides)."""
    dtype = jnp.bfloat16 if settings.compute_dtype == "bfloat16" else jnp.float32
    layers = embed(params, char_ids.astype(jnp.int32), options, dtype=dtype).layers  # [K,B,T,W]
    if settings.output == "mix":
        raw = jnp.asarray(settings.mix_weights, jnp.float32)[None]
        w = settings.gamma * normalized_mix({"weights": raw})[0]
        x = jnp.einsum("k,kbtw->btw", w, layers)
    elif settings.output == "layer":
        x = layers[settings.layer]
    else:
        x = jnp.transpose(layers, (1, 2, 0, 3))  # [B, T, K, W]: a token's rows together
    if settings.sentence_vectors:
        t = jnp.arange(x.shape[1])[None, :]
        keep = ((t >= keep_lo[:, None]) & (t < keep_hi[:, None])).astype(x.dtype)
        return jnp.einsum("bt,bt...->b...", keep, x)
    return x.astype(numpy_dtype(settings.dtype))


class Programs:
    """The corpus program compiled for every batch shape, over a mesh of the
    local devices (rows split over them, parameters replicated)."""

    def __init__(self, params, options, settings, devices, shapes):
        self.mesh = Mesh(np.array(devices), ("data",))
        self.rows = NamedSharding(self.mesh, P("data"))
        replicated = NamedSharding(self.mesh, P())
        self.params = jax.device_put(params, replicated)
        fn = jax.jit(functools.partial(corpus_program, options=options, settings=settings),
                     in_shardings=(replicated, self.rows, self.rows, self.rows),
                     out_shardings=self.rows)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.params)
        width = options.char_cnn.ids_per_token

        def compile_one(shape):
            rows, T = shape
            return fn.lower(abstract, jax.ShapeDtypeStruct((rows, T, width), jnp.int16),
                            jax.ShapeDtypeStruct((rows,), jnp.int32),
                            jax.ShapeDtypeStruct((rows,), jnp.int32)).compile()

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, min(len(shapes), os.cpu_count() or 1))) as pool:
            self.compiled = dict(zip(shapes, pool.map(compile_one, shapes)))

    def place(self, batch: dict) -> tuple:
        return tuple(jax.device_put(batch[k], self.rows)
                     for k in ("char_ids", "keep_lo", "keep_hi"))

    def __call__(self, shape, placed):
        return self.compiled[shape](self.params, *placed)


# ----------------------------------------------------------------------------
# the job


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


END = object()


def embed_corpus(params: dict, options: ElmoOptions, files: Sequence[str], directory: str,
                 settings: CorpusSettings = CorpusSettings(), shard: int = 0,
                 num_shards: int = 1, lexicon=None, devices=None, progress: bool = False
                 ) -> dict:
    """Embed the lines of `files` (in order) into the store `directory`, this
    worker's shard of it; resumes a killed run's store. Returns a summary."""
    settings.check(options)
    if not 0 <= shard < num_shards:
        raise StoreError(f"--shard must be in 0..{num_shards - 1}, got {shard}")
    devices = list(devices or jax.local_devices())
    t0 = time.time()
    row_shape = settings.row_shape(options)
    spec = StoreSpec(model=model_fingerprint(params, options), options=options.to_dict(),
                     output=settings.output, layer=settings.layer,
                     mix_weights=None if settings.mix_weights is None
                     else list(settings.mix_weights),
                     gamma=settings.gamma, sentence_vectors=settings.sentence_vectors,
                     dtype=settings.dtype, row_shape=list(row_shape),
                     inputs=describe_inputs(files), chunk_lines=settings.chunk_lines,
                     num_shards=num_shards, max_length=settings.max_length,
                     tokenize=settings.tokenize, on_bad_line=settings.on_bad_line)
    claim(directory, spec)
    row_bytes = int(np.prod(row_shape)) * numpy_dtype(settings.dtype).itemsize
    writer = open_shard(directory, shard, num_shards, row_bytes)
    summary = {"output": directory, "shard": shard, "num_shards": num_shards,
               "devices": len(devices), "chunks_resumed": len(writer.finished)}
    try:
        if not writer.done:
            summary.update(_run(params, options, files, settings, shard, num_shards, lexicon,
                                devices, writer, row_shape, progress, spec))
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
         row_shape, progress, spec) -> dict:
    from tqdm import tqdm

    row_multiple = int(np.lcm(8, len(devices)))
    shapes = batch_shapes(settings.batch_tokens, settings.max_length, row_multiple,
                          settings.max_rows)
    t = time.time()
    programs = Programs(params, options, settings, devices, shapes)
    compile_s = time.time() - t
    speller = Speller(options, lexicon)
    store_dtype = numpy_dtype(settings.dtype)
    finished = writer.finished
    wanted = lambda c: shard_chunks(c, shard, num_shards) and c not in finished  # noqa: E731
    total_bytes = sum(f["size"] for f in spec.inputs) / num_shards
    bar = tqdm(total=int(total_bytes), unit="B", unit_scale=True, disable=not progress,
               desc=f"shard {shard}/{num_shards}" if num_shards > 1 else "embed",
               smoothing=0.1)
    pipe = _Pipeline()
    placed_q: queue.Queue = queue.Queue(maxsize=2)
    done_q: queue.Queue = queue.Queue(maxsize=3)
    counters = {"tokens": 0, "batches": 0, "t_first": None}

    def read():
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

    def write():
        state = None
        while True:
            item = pipe.get(done_q)
            if item is None or item is END:
                return
            if item[0] == "chunk":
                state = _ChunkState(item[1], row_shape, settings.sentence_vectors)
                if item[2] == 0:
                    _publish(writer, state, store_dtype, bar)
                continue
            _, pieces, out = item
            out = np.asarray(out)
            tokens = state.add(pieces, out, writer)
            counters["tokens"] += tokens
            counters["t_first"] = counters["t_first"] or time.time()
            bar.update(state.take_bytes())
            if progress and counters["t_first"]:
                dt = max(time.time() - counters["t_first"], 1e-9)
                bar.set_postfix_str(f"{counters['tokens'] / dt:,.0f} tokens/s", refresh=False)
            if state.complete:
                _publish(writer, state, store_dtype, bar)

    reader, writer_thread = pipe.thread(read), pipe.thread(write)
    t_start = time.time()
    try:
        while True:
            item = pipe.get(placed_q)
            if item is None:
                break
            if item is END:
                pipe.put(done_q, END)
                break
            if item[0] == "batch":
                _, shape, pieces, placed = item
                with jax.profiler.TraceAnnotation("embed_batch"):  # bench/gpu.py's trace
                    item = ("batch", pieces, programs(shape, placed))
                counters["batches"] += 1
            if not pipe.put(done_q, item):
                break
        writer_thread.join()
    except BaseException:
        pipe.stop.set()
        raise
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


class _ChunkState:
    """What the writer has of the chunk in flight: its lines' starts (rows
    within the chunk), the windows of long lines waiting for their others,
    and with sentence vectors the running sums."""

    def __init__(self, chunk: Chunk, row_shape, sentence_vectors: bool):
        self.chunk = chunk
        n = len(chunk.tokens)
        self.lengths = np.array([len(t) for t in chunk.tokens], np.int64)
        self.todo = int(np.count_nonzero(self.lengths))
        self.starts = np.full(n, -1, np.int64)
        self.rows = 0
        self.parts: dict[int, dict] = {}
        self.sums = np.zeros((n,) + tuple(row_shape), np.float32) if sentence_vectors else None
        self._bytes_left = sum(chunk.line_bytes)
        self._bytes_done = 0

    @property
    def complete(self) -> bool:
        return self.todo == 0

    def take_bytes(self) -> int:
        """The input bytes finished since the last call (the rest of the
        chunk's, blank lines too, once it is complete)."""
        b = self._bytes_left if self.complete else min(self._bytes_done, self._bytes_left)
        self._bytes_left -= b
        self._bytes_done = 0
        return b

    def add(self, pieces: Sequence[Piece], out: np.ndarray, writer: ShardWriter) -> int:
        """Take one batch's results; returns the tokens it finished."""
        rows, tokens = [], 0
        for b, p in enumerate(pieces):
            lo, hi = p.keep
            if self.sums is not None:
                self.sums[p.line] += out[b]
                part = None
            else:
                part = out[b, lo:hi]
            if p.parts > 1:
                got = self.parts.setdefault(p.line, {})
                got[p.part] = part
                if len(got) < p.parts:
                    continue
                part = (None if part is None
                        else np.concatenate([got[k] for k in range(p.parts)]))
                del self.parts[p.line]
            self.todo -= 1
            tokens += int(self.lengths[p.line])
            self._bytes_done += self.chunk.line_bytes[p.line]
            if part is not None:
                self.starts[p.line] = self.rows
                self.rows += len(part)
                rows.append(part)
        if rows:
            writer.append_rows(np.concatenate(rows))
        return tokens


def _publish(writer: ShardWriter, state: _ChunkState, store_dtype: np.dtype, bar) -> None:
    base = writer.rows
    n = len(state.lengths)
    if state.sums is not None:
        means = state.sums / np.maximum(state.lengths, 1).reshape((-1,) + (1,) * (
            state.sums.ndim - 1))
        writer.append_rows(means.astype(store_dtype))
        starts, rows = base + np.arange(n), n
    else:
        empty = state.starts < 0
        state.starts[empty] = state.rows  # a line of no tokens: no rows
        starts, rows = base + state.starts, state.rows
    writer.finish_chunk(state.chunk.index, starts, state.lengths, rows, state.chunk.skipped,
                        tokens=int(state.lengths.sum()))
    bar.update(state.take_bytes())


def shard_of_process(shard: int | None, num_shards: int | None) -> tuple[int, int]:
    """(shard, num_shards): the given ones, or this process's place in a
    `jax.distributed` run."""
    if shard is not None or num_shards is not None:
        return shard or 0, num_shards or 1
    return jax.process_index(), jax.process_count()
