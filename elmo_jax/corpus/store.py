"""An embedding store: a corpus's ELMo vectors on disk, written in chunks by
`corpus.embed_corpus` and read back by `open_embeddings(DIR)`.

    DIR/store.json                    what was embedded, how (`StoreSpec`): the same
                                      for every worker; a rerun that differs is refused
    DIR/shard-00000-of-00002/
        vectors.bin                   one flat array [rows, *row_shape] in the stored
                                      dtype (raw, memory-mappable): a row per token, or
                                      per line with sentence vectors
        starts.bin, lengths.bin       int64 / int32 [lines]: each line's first row and
                                      its token count
        chunk-000000.json ...         completion markers: a chunk counts once its marker
                                      is there (written after its data is on disk)
        done.json                     the shard's totals, once it is finished

The corpus's lines are cut into chunks of `chunk_lines`; chunk c belongs to
shard c % num_shards, so that line i is found without any index beyond the
shard's own (`_locate`). Within a chunk, rows are in the order the job
embedded them (by length), which `starts` undoes; the line order of the store
is the input's. A shard appends, and its markers say how far its files are
whole: a rerun cuts each file back to the last marker (`ShardWriter`).

A store in a bucket (gs://, s3://) is written in write-once objects, since an
object cannot be appended to: each chunk's rows, starts and lengths are
objects of their own (chunk-000000.vectors.bin, .starts.bin, .lengths.bin),
uploaded before its marker (`BucketShardWriter`). Reading one assembles it
once into the local cache as the layout above, memory-mapped from there
(`local_store`).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil
import tempfile
from typing import Iterator, Sequence

import numpy as np

from elmo_jax import errors
from elmo_jax.storage import copies, paths
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.storage.files import read_json, write_json
from elmo_jax.storage.paths import create_exclusively

FORMAT = "elmo-jax-store/1"
SPEC_FILE = "store.json"
DTYPES = ("float32", "float16", "bfloat16")


class StoreError(UserError, ValueError):
    """A store that cannot be written or read as asked; says why and what to do."""


def numpy_dtype(name: str) -> np.dtype:
    if name not in DTYPES:
        raise StoreError(f"dtype must be one of {DTYPES}, got {name!r}")
    if name == "bfloat16":
        import ml_dtypes  # a dependency of jax

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """What a store holds and how it was made: every worker of one job writes
    the same one, and a rerun must match it to continue."""
    model: str                  # the model's fingerprint (`corpus.model_fingerprint`)
    options: dict               # the model's options
    output: str                 # "layers" (all), "layer" (one), "mix"
    layer: int | None           # the layer, for output="layer"
    mix_weights: list | None    # the raw mix weights, for output="mix"
    gamma: float
    sentence_vectors: bool      # a row per line (its tokens' mean) instead of per token
    dtype: str                  # the stored dtype
    row_shape: list             # one row's shape: [K, 2P], [2P]
    inputs: list                # [{path, size, mtime_ns}] in corpus order
    chunk_lines: int
    num_shards: int
    max_length: int
    tokenize: str | None
    on_bad_line: str
    format: str = FORMAT

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def spec_differences(old: dict, new: dict) -> list[str]:
    """The fields in which two specs differ, each as 'field: old -> new'."""
    out = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            a, b = json.dumps(old.get(k)), json.dumps(new.get(k))
            if k == "options":
                a, b = "(one model's options)", "(another's)"
            elif k == "inputs":
                a, b = _input_change(old.get(k) or [], new.get(k) or [])
            out.append(f"{k}: {a[:200]} -> {b[:200]}")
    return out


def _input_change(old: list, new: list) -> tuple[str, str]:
    for a, b in zip(old, new):
        if a != b:
            return tuple(f"{x['path']} ({x['size']} bytes, "
                         + (f"mtime {x['mtime_ns']})" if "mtime_ns" in x
                            else f"version {x.get('version')})") for x in (a, b))
    return f"{len(old)} files", f"{len(new)} files"


def claim(directory: str, spec: StoreSpec) -> None:
    """Make `directory` this job's store, or check that it already is: a store
    made with another model, options, output or input is refused, never mixed."""
    paths.makedirs(directory)
    path = paths.join(directory, SPEC_FILE)
    if paths.exists(path):
        return _same_spec(directory, path, spec)
    # another worker's spec being written (its temporary file) is not "not empty"
    if [n for n in paths.listdir(directory) if not _is_spec_temporary(n)]:
        raise StoreError(f"{directory} is not empty and holds no {SPEC_FILE}: give an empty "
                         "or new folder as --output")
    try:
        if not create_exclusively(path, json.dumps(spec.to_dict(), indent=2) + "\n"):
            return _same_spec(directory, path, spec)  # another worker's came first
    except errors.StorageError:
        raise
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror}") from None


def _same_spec(directory: str, path: str, spec: StoreSpec) -> None:
    old = read_json(path, "store spec", StoreError)
    diff = spec_differences(old, spec.to_dict())
    if diff:
        raise StoreError(f"{directory} holds a store made differently ("
                         + "; ".join(diff) + "): give another --output, or remove it "
                         "to start over")


def _is_spec_temporary(name: str) -> bool:
    return name.startswith(f".{SPEC_FILE}.") and name.endswith(".tmp")



def shard_dir(directory: str, shard: int, num_shards: int) -> str:
    return paths.join(directory, f"shard-{shard:05d}-of-{num_shards:05d}")


def marker_name(chunk: int) -> str:
    return f"chunk-{chunk:06d}.json"


def read_markers(directory: str, shard: int, num_shards: int, names=None) -> list[dict]:
    """The completion markers of a shard's chunks, in order, up to the first
    missing one (`names`: the shard folder's listing, where known)."""
    folder = shard_dir(directory, shard, num_shards)
    markers, k = [], 0
    while True:
        name = marker_name(shard + k * num_shards)
        if not (name in names if names is not None else paths.exists(paths.join(folder, name))):
            return markers
        markers.append(read_json(paths.join(folder, name), "chunk marker", StoreError))
        k += 1


class DiskFull(StoreError):
    pass


# ----------------------------------------------------------------------------
# reading


class EmbeddingStore:
    """A finished store, memory-mapped: `len(store)` lines, `store[i]` line i's
    array as `Elmo.embed_sentences` gives it ([L+1, n_i, 2P] for all layers,
    [n_i, 2P] for one layer or the mix; [L+1, 2P] / [2P] with sentence
    vectors), in the stored dtype; `store[a:b]` a list; iteration in line
    order. It is a random-access data source (grain's protocol: `__len__`,
    `__getitem__`), and `batches` gives padded training batches.

    Args:
        directory: a finished store on the local disk (`open_embeddings`
            opens one anywhere).

    Raises:
        MissingFile: no store there.
    """

    def __init__(self, directory: str):
        self.dir = directory
        path = os.path.join(directory, SPEC_FILE)
        if not os.path.exists(path):
            raise MissingFile(f"no embedding store at {directory} (no {SPEC_FILE})")
        self.spec = read_json(path, "store spec", StoreError)
        if self.spec.get("format") != FORMAT:
            raise StoreError(f"{path}: format {self.spec.get('format')!r}, expected {FORMAT!r}")
        self.dtype = numpy_dtype(self.spec["dtype"])
        self.row_shape = tuple(self.spec["row_shape"])
        N, K = self.spec["num_shards"], self.spec["chunk_lines"]
        self.chunk_lines = K
        self._vectors, self._starts, self._lengths, lines = [], [], [], []
        missing = []
        for s in range(N):
            d = shard_dir(directory, s, N)
            done = os.path.join(d, "done.json")
            if not os.path.exists(done):
                missing.append(s)
                continue
            totals = read_json(done, "shard totals", StoreError)
            lines.append(totals["lines"])
            self._vectors.append(_memmap(os.path.join(d, "vectors.bin"), self.dtype,
                                         (totals["rows"],) + self.row_shape))
            self._starts.append(_memmap(os.path.join(d, "starts.bin"), np.int64,
                                        (totals["lines"],)))
            self._lengths.append(_memmap(os.path.join(d, "lengths.bin"), np.int32,
                                         (totals["lines"],)))
        if missing:
            raise StoreError(f"{directory} is not finished: shard(s) {missing} of {N} have not "
                             "completed (run the same command for them; finished chunks "
                             "are kept)")
        self._len = int(sum(lines))
        self.skipped = [s for sh in range(N) for s in _skipped(shard_dir(directory, sh, N))]

    def __len__(self) -> int:
        return self._len

    def _locate(self, i: int) -> tuple[int, int]:
        """(shard, line within the shard) of corpus line i."""
        N, K = self.spec["num_shards"], self.chunk_lines
        chunk = i // K
        return chunk % N, (chunk // N) * K + i % K

    def length(self, i: int) -> int:
        """The number of tokens of a line, without reading its vectors.

        Args:
            i: the line (negative counts from the end).

        Returns:
            n_i.
        """
        s, j = self._locate(self._index(i))
        return int(self._lengths[s][j])

    def _index(self, i) -> int:
        i = int(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"line {i} is out of range: the store has {self._len} lines")
        return i

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        s, j = self._locate(self._index(i))
        start = int(self._starts[s][j])
        if self.spec["sentence_vectors"]:
            return np.asarray(self._vectors[s][start])
        rows = np.asarray(self._vectors[s][start:start + int(self._lengths[s][j])])
        return np.moveaxis(rows, 0, -2) if rows.ndim == 3 else rows

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self._len):
            yield self[i]

    def batches(self, batch_size: int, indices: Sequence[int] | None = None,
                shuffle: bool = False, seed: int = 0, min_length: int = 8,
                dtype=np.float32) -> Iterator[dict]:
        """Padded batches of token rows, for training on stored vectors.

        Args:
            batch_size: B, lines a batch; the last batch is padded with
                empty rows to B.
            indices: the lines, in order (default all).
            shuffle: shuffle them (per `seed`).
            seed: the shuffle's seed.
            min_length: the shortest T.
            dtype: the features' dtype.

        Yields:
            {"features": [B, T] + row_shape (T a power of two >= the longest
            line, so few shapes are compiled), "mask": [B, T] bool, "index":
            [B] int, the lines (-1 for padding rows)}.

        Raises:
            StoreError: a store of sentence vectors (no tokens to batch).
        """
        if self.spec["sentence_vectors"]:
            raise StoreError("a store of sentence vectors has no tokens to batch; index it "
                             "(store[i]) or stack it (np.stack(list(store)))")
        from elmo_jax.core.batching import next_power_of_two

        order = np.arange(self._len) if indices is None else np.asarray(indices, np.int64)
        if shuffle:
            order = np.random.default_rng(seed).permutation(order)
        for a in range(0, len(order), batch_size):
            idx = order[a:a + batch_size]
            arrays = [self._rows(i) for i in idx]
            T = next_power_of_two(max([len(x) for x in arrays] + [1]), min_length)
            feats = np.zeros((batch_size, T) + self.row_shape, dtype)
            mask = np.zeros((batch_size, T), bool)
            for b, x in enumerate(arrays):
                feats[b, :len(x)] = x
                mask[b, :len(x)] = True
            index = np.full(batch_size, -1, np.int64)
            index[:len(idx)] = idx
            yield {"features": feats, "mask": mask, "index": index}

    def _rows(self, i: int) -> np.ndarray:
        """Line i's rows [n_i, *row_shape] (token-major, as stored)."""
        s, j = self._locate(self._index(i))
        start = int(self._starts[s][j])
        return self._vectors[s][start:start + int(self._lengths[s][j])]


def _memmap(path: str, dtype, shape) -> np.ndarray:
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _skipped(shard: str) -> list[dict]:
    out = []
    for marker in sorted(glob.glob(os.path.join(shard, "chunk-*.json"))):
        out += read_json(marker, "chunk marker", StoreError).get("skipped", [])
    return out


def open_embeddings(directory: str | os.PathLike) -> EmbeddingStore:
    """A finished embedding store.

    Args:
        directory: the store (written by `elmo-jax embed --output DIR` or
            `embed_corpus`), local or in a bucket (read from its local copy,
            `local_store`, assembled once).

    Returns:
        An `EmbeddingStore`: `len(store)` lines; `store[i]` line i's vectors
        ([K, n_i, 2P] for all layers, [n_i, 2P] for one layer or a mix, a row
        per line with sentence vectors), memory-mapped; `store.batches(...)`
        padded batches.
    """
    directory = paths.check(directory)
    if paths.is_remote(directory):
        return EmbeddingStore(local_store(directory))
    return EmbeddingStore(directory)


def local_store(directory: str, progress: bool = True) -> str:
    """The finished store in a bucket, assembled once into the local cache in
    the local layout (each shard's chunk objects joined into its three
    files), under a name of the store's objects' identities; its path. The
    copy is as large as the store: it says so when it makes one."""
    spec_path = paths.join(directory, SPEC_FILE)
    if not paths.exists(spec_path):
        raise MissingFile(f"no embedding store at {directory} (no {SPEC_FILE})")
    spec = read_json(spec_path, "store spec", StoreError)
    n = spec["num_shards"]
    listings = [set(paths.listdir(shard_dir(directory, s, n))) for s in range(n)]
    missing = [s for s in range(n) if "done.json" not in listings[s]]
    if missing:
        raise StoreError(f"{directory} is not finished: shard(s) {missing} of {n} have not "
                         "completed (run the same command for them; finished chunks are kept)")
    key = "\0".join([directory, paths.identity(spec_path)] + [
        paths.identity(paths.join(shard_dir(directory, s, n), "done.json")) for s in range(n)])
    import hashlib

    dest = os.path.join(copies.local_cache_root(), "stores",
                        hashlib.sha256(key.encode()).hexdigest()[:24])
    if os.path.exists(os.path.join(dest, SPEC_FILE)):
        return dest
    if progress:
        logging.getLogger(__name__).info(f"copying the store {directory} into the local "
                                         f"cache {dest}")
    try:
        with paths.atomic_dir(dest) as tmp:
            for s in range(n):
                _assemble_shard(directory, s, n, listings[s], tmp)
            shutil.copyfile(copies.local_copy(spec_path), os.path.join(tmp, SPEC_FILE))
    except OSError:  # another process assembled it meanwhile
        if not os.path.exists(os.path.join(dest, SPEC_FILE)):
            raise
    return dest


def _assemble_shard(directory: str, shard: int, n: int, names: set, out_root: str) -> None:
    remote = shard_dir(directory, shard, n)
    out = os.path.join(out_root, os.path.basename(remote))
    os.makedirs(out)
    files = {suffix: open(os.path.join(out, suffix), "wb")
             for suffix in ("vectors.bin", "starts.bin", "lengths.bin")}
    try:
        for marker in read_markers(directory, shard, n, names):
            stem = marker_name(marker["chunk"])[:-len(".json")]
            for suffix, fh in files.items():
                with paths.open(paths.join(remote, f"{stem}.{suffix}"), "rb") as src:
                    shutil.copyfileobj(src, fh, 1 << 22)
            write_json(os.path.join(out, marker_name(marker["chunk"])), marker)
    finally:
        for fh in files.values():
            fh.close()
    shutil.copyfile(copies.local_copy(paths.join(remote, "done.json")),
                    os.path.join(out, "done.json"))


def merge_to_hdf5(directory: str, out: str) -> int:
    """Write a store as bilm-tf's `dump_bilm_embeddings` file: dataset str(i)
    for line i, float32 (as bilm-tf's) unless the store's dtype is narrower.
    The space is checked first (h5py crashes on a full disk); the file appears
    whole or not at all. Returns the number of lines."""
    import h5py

    from elmo_jax.storage.paths import atomic_path

    store = open_embeddings(directory)
    dtype = np.float32 if store.spec["dtype"] == "bfloat16" else store.dtype
    rows = sum(len(v) for v in store._vectors)
    need = rows * int(np.prod(store.row_shape)) * np.dtype(dtype).itemsize + 2048 * len(store)
    folder = tempfile.gettempdir() if paths.is_remote(out) else os.path.dirname(
        os.path.abspath(out))  # a bucket's file is made locally first
    free = shutil.disk_usage(folder).free
    if free < need:
        raise DiskFull(f"not enough space for {out}: it needs about {need / 2**20:.1f} MiB, "
                       f"{free / 2**20:.1f} MiB are free on its device; the store {directory} "
                       "is kept, free some space and run the same command again")
    with atomic_path(out) as tmp:
        with h5py.File(tmp, "w") as fh:
            for i in range(len(store)):
                fh.create_dataset(str(i), data=np.asarray(store[i], dtype))
    return len(store)
