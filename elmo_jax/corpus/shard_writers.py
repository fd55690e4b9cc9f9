"""The writers of a store's shards (the layout: `store.py`): `ShardWriter`
appends files on a local disk, cut back to the last marker when reopened, and
holds the shard's lock while it writes; `BucketShardWriter` writes each chunk
as write-once objects in a bucket."""
from __future__ import annotations

import errno
import glob
import os
import shutil
import tempfile
from typing import Sequence

import numpy as np

from elmo_jax.storage import paths
from elmo_jax.storage.files import write_json
from elmo_jax.corpus.store import DiskFull, StoreError, marker_name, read_markers, shard_dir


def open_shard(directory: str, shard: int, num_shards: int, row_bytes: int):
    """The writer of one shard: appending files on a local disk, write-once
    objects in a bucket."""
    if paths.is_remote(directory):
        return BucketShardWriter(directory, shard, num_shards, row_bytes)
    return ShardWriter(directory, shard, num_shards, row_bytes)


def shard_chunks(chunk: int, shard: int, num_shards: int) -> bool:
    """Whether global chunk `chunk` is shard `shard`'s."""
    return chunk % num_shards == shard


class ShardWriter:
    """Appends one shard's chunks; each is whole once its marker is written.

    On opening, files are cut back to the last marker (a killed run's partial
    chunk is dropped) and stray temporary files removed; `finished` lists the
    global chunks already done. A write that fails for lack of space cuts the
    files back the same way and raises `DiskFull`, naming the path and the
    space needed: the finished chunks stay, and a rerun continues."""

    def __init__(self, directory: str, shard: int, num_shards: int, row_bytes: int):
        self.dir = shard_dir(directory, shard, num_shards)
        self.shard, self.num_shards, self.row_bytes = shard, num_shards, row_bytes
        os.makedirs(self.dir, exist_ok=True)
        self._lock = _take_shard(self.dir, shard, num_shards)
        for tmp in glob.glob(os.path.join(self.dir, ".*.tmp")):
            os.unlink(tmp)
        self.markers = read_markers(directory, shard, num_shards)
        last = self.markers[-1] if self.markers else {"rows": 0, "lines": 0}
        self.rows, self.lines = last["rows"], last["lines"]
        self._files = {}
        for name, size in self._sizes().items():
            fh = open(os.path.join(self.dir, name), "ab")
            fh.truncate(size)
            self._files[name] = fh
        self.done = os.path.exists(os.path.join(self.dir, "done.json"))

    def _sizes(self) -> dict:
        return {"vectors.bin": self.rows * self.row_bytes, "starts.bin": self.lines * 8,
                "lengths.bin": self.lines * 4}

    @property
    def finished(self) -> set[int]:
        return {m["chunk"] for m in self.markers}

    def append_rows(self, rows: np.ndarray) -> None:
        """Append rows [n, *row_shape] of the chunk in flight."""
        self._write("vectors.bin", rows)

    def _write(self, name: str, array: np.ndarray) -> None:
        try:
            self._files[name].write(np.ascontiguousarray(array).tobytes())
        except OSError as e:
            self._failed(name, e, array.nbytes)
            raise

    def finish_chunk(self, chunk: int, starts: np.ndarray, lengths: np.ndarray,
                     rows_in_chunk: int, skipped: Sequence[dict] = (),
                     tokens: int = 0) -> None:
        """Publish chunk `chunk` (global index): its lines' starts (absolute
        rows) and lengths, then its marker, after the data is on disk."""
        self._write("starts.bin", starts.astype(np.int64))
        self._write("lengths.bin", lengths.astype(np.int32))
        try:
            for fh in self._files.values():
                fh.flush()
                os.fsync(fh.fileno())
            self.rows += rows_in_chunk
            self.lines += len(starts)
            marker = {"chunk": chunk, "rows": self.rows, "lines": self.lines,
                      "tokens": int(tokens), "skipped": list(skipped)}
            write_json(os.path.join(self.dir, marker_name(chunk)), marker)
        except OSError as e:
            self._failed("chunk marker", e, 4096)
            raise
        self.markers.append(marker)

    def _failed(self, name: str, e: OSError, nbytes: int) -> None:
        """Cut every file back to the last marker; a full disk becomes DiskFull."""
        last = self.markers[-1] if self.markers else {"rows": 0, "lines": 0}
        self.rows, self.lines = last["rows"], last["lines"]
        for n, size in self._sizes().items():
            try:
                fh = self._files[n]
                fh.seek(0, os.SEEK_END)
                fh.truncate(size)
            except OSError:
                pass
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(self.dir).free
            raise DiskFull(
                f"no space left on the device of {os.path.join(self.dir, name)} "
                f"({free / 2**20:.1f} MiB free; the chunk in flight needs at least "
                f"{max(nbytes, 1) / 2**20:.1f} MiB more, at {self.row_bytes} bytes a row): "
                f"the {len(self.markers)} finished chunk(s) of this shard are kept; free some "
                "space and run the same command again to continue") from None

    def finish(self, totals: dict) -> None:
        write_json(os.path.join(self.dir, "done.json"), totals)
        self.done = True

    def close(self) -> None:
        for fh in self._files.values():
            try:
                fh.close()
            except OSError:
                pass
        if self._lock is not None:
            os.unlink(os.path.join(self.dir, LOCK_FILE))  # while still held: see _take_shard
            self._lock.close()
            self._lock = None


LOCK_FILE = ".writer.lock"


def _take_shard(folder: str, shard: int, num_shards: int):
    """Lock shard `folder` for this process (an exclusive `flock`, which the
    system lets go when the process dies, kill -9 included); a StoreError
    naming the holder if another worker has it. Returns the open lock file.
    The file is removed by its holder before it lets go, so a worker that
    locked a removed file tries again on the new one."""
    import fcntl
    import socket

    path = os.path.join(folder, LOCK_FILE)
    while True:
        fh = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another worker"
            fh.close()
            raise StoreError(f"shard {shard} of {num_shards} of {os.path.dirname(folder)} is "
                             f"being written by {holder}: give each worker its own --shard "
                             "(or --distributed); once that worker ends, or is killed, this "
                             "command takes the shard over where it stopped") from None
        try:
            same = os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()  # its holder removed it as we locked it: lock the new one
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    fh.flush()
    return fh


class BucketShardWriter:
    """One shard of a store in a bucket, in write-once objects: the chunk in
    flight's rows gather in a local temporary file; `finish_chunk` uploads
    them, the chunk's starts and lengths, then its marker. A killed run's
    chunk without a marker is written again by the rerun (same names), so a
    resumed store is the uninterrupted one's, byte for byte."""

    def __init__(self, directory: str, shard: int, num_shards: int, row_bytes: int):
        self.dir = shard_dir(directory, shard, num_shards)
        self.shard, self.num_shards, self.row_bytes = shard, num_shards, row_bytes
        names = set(paths.listdir(self.dir))
        self.markers = read_markers(directory, shard, num_shards, names)
        last = self.markers[-1] if self.markers else {"rows": 0, "lines": 0}
        self.rows, self.lines = last["rows"], last["lines"]
        self.done = "done.json" in names
        self._tmp = tempfile.mkdtemp(prefix="elmo-jax-shard-")
        self._rows = open(os.path.join(self._tmp, "vectors.bin"), "wb")

    @property
    def finished(self) -> set[int]:
        return {m["chunk"] for m in self.markers}

    def append_rows(self, rows: np.ndarray) -> None:
        self._rows.write(np.ascontiguousarray(rows).tobytes())

    def finish_chunk(self, chunk: int, starts: np.ndarray, lengths: np.ndarray,
                     rows_in_chunk: int, skipped: Sequence[dict] = (),
                     tokens: int = 0) -> None:
        self._rows.close()
        stem = paths.join(self.dir, marker_name(chunk)[:-len(".json")])
        paths.upload(self._rows.name, stem + ".vectors.bin")
        for suffix, array in ((".starts.bin", starts.astype(np.int64)),
                              (".lengths.bin", lengths.astype(np.int32))):
            paths.write_bytes(stem + suffix, np.ascontiguousarray(array).tobytes())
        self._rows = open(os.path.join(self._tmp, "vectors.bin"), "wb")
        self.rows += rows_in_chunk
        self.lines += len(starts)
        marker = {"chunk": chunk, "rows": self.rows, "lines": self.lines,
                  "tokens": int(tokens), "skipped": list(skipped)}
        write_json(paths.join(self.dir, marker_name(chunk)), marker)  # last: the chunk counts
        self.markers.append(marker)

    def finish(self, totals: dict) -> None:
        write_json(paths.join(self.dir, "done.json"), totals)
        self.done = True

    def close(self) -> None:
        self._rows.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
