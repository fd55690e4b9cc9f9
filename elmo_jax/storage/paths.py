"""Every path a user gives, local or in a bucket: `gs://bucket/...` (Google
Cloud Storage, through gcsfs) and `s3://bucket/...` (S3 and its look-alikes,
through s3fs), both fsspec file systems. A local path behaves as it always has
(`~` expanded, `file://` taken off); a path of another scheme, or a malformed
one, is a `PathError` before anything is read or written.

A bucket is not a disk: an object is written whole or not at all, never
appended to nor renamed. So writes go to a local temporary file that is
uploaded whole on success (`atomic_path`), and reads that want a local
file (h5py, a memory map, a corpus read many times) take `local_copy`: the
object downloaded once into the local cache, keyed by the object's identity
(size and generation), so a changed object is fetched again.

The parser of a path's scheme, the clients, their credentials, errors and
retries are `clients.py`'s; the
local copies of objects and the local mirrors of bucket folders `copies.py`'s.
"""
from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile

from elmo_jax.storage.clients import filesystem, retry, scheme, storage_errors
from elmo_jax.errors import StorageError
def is_remote(path) -> bool:
    return path is not None and scheme(path) is not None


def check(path: str | os.PathLike) -> str:
    """`path` as elmo-jax uses it: a bucket path as given (without a trailing
    slash), a local one with `~` expanded and `file://` taken off."""
    text = os.fspath(path)
    if scheme(text) is not None:
        return text.rstrip("/") if text.count("/") > 3 else text
    if text.lower().startswith("file://"):
        text = text[len("file://"):]
    return os.path.expanduser(text)


def join(path, *parts: str) -> str:
    path = check(path)
    if scheme(path) is None:
        return os.path.join(path, *parts)
    return "/".join([path.rstrip("/"), *(p.strip("/") for p in parts)])


def dirname(path) -> str:
    path = check(path)
    return path.rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(path)


def basename(path) -> str:
    path = check(path)
    return path.rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def _ask(path, question: str) -> bool:
    """os.path's `question` ("exists", "isdir", "isfile") of a local path, or
    the bucket's of an object path (a missing bucket is a StorageError)."""
    path = check(path)
    if not is_remote(path):
        return getattr(os.path, question)(path)
    with storage_errors(path):
        return bucket_checked(path, getattr(filesystem(path), question)(path))


def exists(path) -> bool:
    return _ask(path, "exists")


def isdir(path) -> bool:
    return _ask(path, "isdir")


def isfile(path) -> bool:
    return _ask(path, "isfile")


def bucket_checked(path: str, found: bool) -> bool:
    """`found` (an object or prefix `path` was found), after making sure that
    a path not found is not a bucket that does not exist (which every client
    reports as a path not found)."""
    if found:
        return True
    fs = filesystem(path)
    bucket = path.split("/")[2]
    try:
        fs.ls(bucket, detail=False)
    except FileNotFoundError:
        raise StorageError(f"the bucket {bucket} of {path} does not exist: create it, or "
                           "check its name") from None
    return False


def is_url(path) -> bool:
    """An http(s) URL: a published model's address, which only the model
    hub reads (`formats.hub`), not a storage path."""
    return str(path).lower().startswith(("http://", "https://"))


def makedirs(path) -> None:
    """A local folder and its parents; nothing for a bucket path, whose
    folders are only the names of the objects in them."""
    path = check(path)
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
    else:
        exists(path)  # a bucket that does not exist is said now, not at the first write


def glob(pattern) -> list[str]:
    """The files matching a glob, sorted (bucket paths with their scheme)."""
    pattern = check(pattern)
    if not is_remote(pattern):
        import glob as _glob

        return sorted(p for p in _glob.glob(pattern) if os.path.isfile(p))
    name, fs = scheme(pattern), filesystem(pattern)
    with storage_errors(pattern):
        try:
            found = fs.glob(pattern, detail=True)
        except FileNotFoundError:
            found = {}
        if not found:
            bucket_checked(pattern, False)
    return sorted(f"{name}://{p}" for p, info in found.items() if info.get("type") == "file")


def listdir(path) -> list[str]:
    """The names in a folder (for a bucket path, of the objects and prefixes
    under it); [] when there is none."""
    path = check(path)
    if not is_remote(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs = filesystem(path)
    with storage_errors(path):
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1]
                          for p in fs.ls(path, detail=False, refresh=True)
                          if p.rstrip("/") != path.split("://", 1)[1].rstrip("/"))
        except FileNotFoundError:
            bucket_checked(path, False)
            return []


def open(path, mode: str = "rb", **kwargs):  # noqa: A001 (the name says what it is)
    """A file object of `path`: local, or a bucket object (read: streamed in
    blocks; write: uploaded when closed; prefer `atomic_path` for
    writes, which uploads only on success)."""
    path = check(path)
    if not is_remote(path):
        return builtins.open(path, mode, **kwargs)
    with storage_errors(path):
        return filesystem(path).open(path, mode, **kwargs)


def read_bytes(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def read_text(path) -> str:
    return read_bytes(path).decode("utf-8")


def remove(path, recursive: bool = False) -> None:
    path = check(path)
    if not is_remote(path):
        if os.path.isdir(path) and recursive:
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    with storage_errors(path):
        try:
            filesystem(path).rm(path, recursive=recursive)
        except FileNotFoundError:
            pass


def upload(local: str, path: str) -> None:
    """Put a local file at a bucket path, whole (an object appears complete
    or not at all); tried again for `retry_seconds()` while the service fails."""
    fs = filesystem(path)

    def put():
        with storage_errors(path):
            fs.put_file(local, path)
    retry(put, path)


def write_bytes(path: str, data: bytes) -> None:
    """`data` as the file or object `path`, whole (see `upload`)."""
    path = check(path)
    if not is_remote(path):
        with atomic_path(path) as tmp, builtins.open(tmp, "wb") as fh:
            fh.write(data)
        return
    fs = filesystem(path)

    def pipe():
        with storage_errors(path):
            fs.pipe_file(path, data)
    retry(pipe, path)


def create_new(path: str, data: bytes) -> bool:
    """`data` as the new object `path` unless one is there (then False): the
    service checks, in one request (GCS: ifGenerationMatch=0, S3:
    If-None-Match), so of two writers exactly one creates it. A retry after a
    lost answer may find its own object: callers write what identifies them."""
    fs = filesystem(path)

    def pipe():
        with storage_errors(path):
            fs.pipe_file(path, data, mode="create")
    try:
        retry(pipe, path)
        return True
    except FileExistsError:
        return False


def version(path) -> tuple[int, str]:
    """(size, what changes when the file changes): a local file's mtime, an
    object's generation (or ETag), asked afresh (no listing cache)."""
    path = check(path)
    if not is_remote(path):
        st = os.stat(path)
        return st.st_size, str(st.st_mtime_ns)
    with storage_errors(path):
        info = filesystem(path).info(path)
    return int(info.get("size")), object_changes(info)


def object_changes(info: dict) -> str:
    """What changes when an object changes, from its info or listing entry:
    GCS's generation, S3's ETag (or a modification time)."""
    return str(info.get("generation") or info.get("ETag") or info.get("etag")
               or info.get("mtime") or info.get("LastModified") or info.get("updated"))


def identity(path) -> str:
    """`version(path)` as one string, for cache keys."""
    size, changes = version(path)
    return f"{size}-{changes}"


def download(path: str, dest: str) -> None:
    """The object `path` as the local file `dest`, which appears whole (a
    temporary beside it, renamed); tried again while the service fails."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    with atomic_path(dest) as tmp:
        def get():
            with storage_errors(path):
                filesystem(path).get_file(path, tmp)
        retry(get, path)


def size(path) -> int:
    path = check(path)
    if not is_remote(path):
        return os.path.getsize(path)
    with storage_errors(path):
        return int(filesystem(path).info(path)["size"])


def umask() -> int:
    """The process's umask, read without setting it: setting it to read it
    (os.umask's only way) gives a file that another thread creates meanwhile
    (orbax's, the metrics writer's) the mode 0666. Linux states it in
    /proc/self/status; elsewhere it is read once, at the first call."""
    try:
        with builtins.open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    if not _UMASK_READ:
        mask = os.umask(0o077)  # the safe way round for anything created meanwhile
        os.umask(mask)
        _UMASK_READ.append(mask)
    return _UMASK_READ[0]


_UMASK_READ: list[int] = []


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success it is given the
    umask's mode and renamed to `path`, on an error removed. For a bucket
    path the temporary file is local and uploaded whole on success."""
    path = check(path)
    if is_remote(path):
        with _remote_atomic_path(path) as tmp:
            yield tmp
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _remote_atomic_path(path: str):
    fd, tmp = tempfile.mkstemp(prefix=f".{basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        upload(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str, replace: bool = False):
    """Yield a temporary local folder beside the folder `path`; on success it
    is renamed to `path` (an existing `path` removed first with `replace`,
    else the rename's OSError is the caller's: another process made it), on
    an error removed."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        yield tmp
        if replace and os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def create_exclusively(path: str, text: str) -> bool:
    """Write `text` as the new file or object `path`, whole, unless one is
    there already (then False). Locally a temporary file beside it is linked
    into place (a link, unlike a rename, fails where a file is); in a bucket
    the service refuses the second (`create_new`)."""
    if is_remote(path):
        return create_new(path, text.encode("utf-8"))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~umask())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
