"""Local copies of what is in a bucket, for readers and writers that need a
local file: `local_copy` (an object downloaded once into the local cache,
keyed by its identity: a changed object is fetched again), `local_copy_tree`
(a prefix as a local folder), `Mirror` (a local folder that writers append
to, uploaded whole file by file) and `written_folder` (files written locally,
uploaded when the block ends). Each is the path itself for a local path.

The local cache is $ELMO_JAX_CACHE when that is a local path, else
${XDG_CACHE_HOME:-~/.cache}/elmo-jax.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile

from elmo_jax.storage import clients, paths
from elmo_jax import environment
from elmo_jax.errors import MissingFile, UserError


def local_cache_root() -> str:
    """The local cache: $ELMO_JAX_CACHE when it is a local path, else
    ~/.cache/elmo-jax (under $XDG_CACHE_HOME if set)."""
    root = environment.cache_setting()
    if not root or paths.is_remote(root):
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "elmo-jax")
    return paths.check(root)


def local_cache_dir() -> str:
    """The local folder of downloaded copies of bucket objects."""
    return os.path.join(local_cache_root(), "objects")


def local_copy(path) -> str:
    """A local file with `path`'s contents: `path` itself when local, else the
    object downloaded once into `local_cache_dir()` under a name of its URL
    and identity (a new generation is a new copy; the copy appears whole)."""
    path = paths.check(path)
    if not paths.is_remote(path):
        return path
    return _cached_copy(path, paths.identity(path))


def _cached_copy(path: str, identity: str) -> str:
    """The local copy of the object `path` whose identity (size, generation)
    is `identity`: downloaded unless the cache has it."""
    key = hashlib.sha256(f"{path}\0{identity}".encode()).hexdigest()[:24]
    dest = os.path.join(local_cache_dir(), key, paths.basename(path))
    if os.path.exists(dest):
        return dest
    paths.download(path, dest)
    return dest


def local_copies(files: list[str], workers: int = 8) -> list[str]:
    """`local_copy` of each file, the downloads `workers` at a time (a bucket
    answers many requests at once far faster than one after another)."""
    if not any(paths.is_remote(f) for f in files):
        return [paths.check(f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(local_copy, files))


def local_copy_tree(path) -> str:
    """A local folder with the objects under the bucket prefix `path` (each
    a `local_copy`, linked into one folder of the prefix's identity); `path`
    itself when local."""
    path = paths.check(path)
    if not paths.is_remote(path):
        return path
    name, fs = paths.scheme(path), clients.filesystem(path)
    with clients.storage_errors(path):
        found = fs.find(path, detail=True)
    if not found:
        paths.bucket_checked(path, False)
        raise MissingFile(f"no files under {path}")
    root = path.split("://", 1)[1].rstrip("/") + "/"
    entries = sorted((p[len(root):], f"{int(info.get('size'))}-{paths.object_changes(info)}")
                     for p, info in found.items() if p.startswith(root))
    key = hashlib.sha256(repr((path, entries)).encode()).hexdigest()[:24]
    dest = os.path.join(local_cache_dir(), key, paths.basename(path))
    if not os.path.isdir(dest):
        from concurrent.futures import ThreadPoolExecutor

        try:  # the listing's identities: no second request per object
            with paths.atomic_dir(dest) as tmp:
                with ThreadPoolExecutor(8) as pool:
                    copies = list(pool.map(
                        lambda e: _cached_copy(f"{name}://{root}{e[0]}", e[1]), entries))
                for (rel, _), copy in zip(entries, copies):
                    target = os.path.join(tmp, rel)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copyfile(copy, target)
        except OSError:  # another process made it meanwhile
            if not os.path.isdir(dest):
                raise
    return dest


class Mirror:
    """A local folder that stands for a folder in a bucket, for writers that
    append or write by name (the metrics log, TensorBoard's event files, a
    profiler trace): `sync()` uploads each file changed since the last sync,
    whole, so the bucket's copy is always a complete earlier state of it. For
    a local `folder` it is that folder and `sync` does nothing."""

    def __init__(self, folder: str, fetch: tuple[str, ...] = ()):
        """`fetch`: names of files to download first, to be appended to."""
        self.remote = paths.check(folder)
        if not paths.is_remote(self.remote):
            self.local = self.remote
            return
        self.local = tempfile.mkdtemp(prefix="elmo-jax-mirror-")
        self._synced: dict[str, tuple[int, int]] = {}
        for name in fetch:
            if paths.exists(paths.join(self.remote, name)):
                with clients.storage_errors(self.remote):
                    clients.filesystem(self.remote).get_file(paths.join(self.remote, name),
                                                     os.path.join(self.local, name))
                self._synced[name] = self._stamp(name)

    def _stamp(self, rel: str) -> tuple[int, int]:
        st = os.stat(os.path.join(self.local, rel))
        return st.st_size, st.st_mtime_ns

    def sync(self) -> None:
        if self.local == self.remote:
            return
        for root, _, names in os.walk(self.local):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), self.local)
                stamp = self._stamp(rel)
                if self._synced.get(rel) != stamp:
                    paths.upload(os.path.join(self.local, rel),
                                 paths.join(self.remote, *rel.split(os.sep)))
                    self._synced[rel] = stamp

    def close(self, sync: bool = True) -> None:
        """Sync (unless `sync` is False: after a failed one), then remove the
        local folder of a bucket's mirror."""
        if self.local != self.remote:
            try:
                if sync:
                    self.sync()
            finally:
                shutil.rmtree(self.local, ignore_errors=True)


@contextlib.contextmanager
def written_folder(folder):
    """Yield a local folder to write `folder`'s files into: `folder` itself
    when local; for a bucket path a temporary one, each of whose files is
    uploaded whole once the block ends without an error (none on an error)."""
    folder = paths.check(folder)
    if not paths.is_remote(folder):
        os.makedirs(folder, exist_ok=True)
        yield folder
        return
    paths.exists(folder)  # a missing bucket is said before anything is written
    mirror = Mirror(folder)
    try:
        yield mirror.local
        mirror.sync()
    finally:
        shutil.rmtree(mirror.local, ignore_errors=True)


class FolderNotEmpty(UserError, FileExistsError):
    """An output folder that already holds something (nothing is overwritten)."""


@contextlib.contextmanager
def new_folder(folder, last: tuple[str, ...] = ()):
    """Yield a local folder to write the artifact `folder` into, whole: it must
    not exist or be empty. A local `folder` appears by one rename when the
    block ends without an error; a bucket's gets each file uploaded, the
    files named in `last` (what a reader opens first) after the others, so
    an interrupted upload leaves no artifact that loads. Nothing is written
    on an error."""
    folder = paths.check(folder)
    if paths.exists(folder) and (not paths.isdir(folder) or paths.listdir(folder)):
        raise FolderNotEmpty(f"{folder} exists and is not an empty folder: choose a new "
                             "--out (nothing is overwritten)")
    if not paths.is_remote(folder):
        with paths.atomic_dir(folder, replace=True) as tmp:
            yield tmp
        return
    tmp = tempfile.mkdtemp(prefix="elmo-jax-artifact-")
    try:
        yield tmp
        files = sorted(os.path.relpath(os.path.join(root, n), tmp)
                       for root, _, names in os.walk(tmp) for n in names)
        for rel in sorted(files, key=lambda rel: rel in last):
            paths.upload(os.path.join(tmp, rel), paths.join(folder, *rel.split(os.sep)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
