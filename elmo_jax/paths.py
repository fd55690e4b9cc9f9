"""Every path a user gives, local or in a bucket: `gs://bucket/...` (Google
Cloud Storage, through gcsfs) and `s3://bucket/...` (S3 and its look-alikes,
through s3fs), both fsspec file systems. A local path behaves as it always has
(`~` expanded, `file://` taken off); a path of another scheme, or a malformed
one, is a `PathError` before anything is read or written.

A bucket is not a disk: an object is written whole or not at all, never
appended to nor renamed. So writes go to a local temporary file that is
uploaded whole on success (`files.atomic_path`), and reads that want a local
file (h5py, a memory map, a corpus read many times) take `local_copy`: the
object downloaded once into the local cache, keyed by the object's identity
(size and generation), so a changed object is fetched again.

The clients find their endpoint and credentials the usual way: gcsfs the
machine's Google credentials (`GOOGLE_APPLICATION_CREDENTIALS`, the metadata
server) or `STORAGE_EMULATOR_HOST`; s3fs boto's (`AWS_*`, `AWS_ENDPOINT_URL`).
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time

from elmo_jax.errors import UserError

# scheme -> (the fsspec protocol, the package that implements it, the extra)
REMOTE = {"gs": ("gcs", "gcsfs", "gcs"), "s3": ("s3", "s3fs", "s3")}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# gs:/b: a bucket path through os.path.normpath (the "gs:" folder of old)
_ONE_SLASH = re.compile(r"^(gs|s3):/(?!/)", re.IGNORECASE)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")


class PathError(UserError, ValueError):
    """A path elmo-jax cannot open: an unknown scheme, a malformed bucket path,
    a client library that is not installed."""


class StorageError(UserError, OSError):
    """Remote storage refused or failed: no such bucket, no permission, no
    credentials, the service unreachable; the message says what to do.
    `transient`: the service failed (it may answer again: `retry` waits)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def scheme(path: str | os.PathLike) -> str | None:
    """"gs" or "s3" for a bucket path, None for a local one; a PathError for
    any other scheme or a malformed bucket path."""
    text = os.fspath(path)
    one = _ONE_SLASH.match(text)
    if one:
        raise PathError(f"{text}: a bucket path is {one.group(1).lower()}://BUCKET/PATH "
                        "(two slashes)")
    m = _SCHEME.match(text)  # a local name may hold a colon ("a:b"), never "://"
    if m is None:
        return None
    name = m.group(1).lower()
    if name == "file":
        return None
    if name not in REMOTE:
        raise PathError(f"{text}: elmo-jax reads and writes local paths, gs://BUCKET/... and "
                        f"s3://BUCKET/...; not {name}://")
    bucket = text[m.end():].split("/", 1)[0]
    if not _BUCKET.match(bucket):
        raise PathError(f"{text}: {bucket!r} is not a bucket name (3-222 characters: "
                        "lower-case letters, digits, '.', '-' and '_')")
    return name


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


def filesystem(path):
    """The fsspec file system of a bucket path (one per scheme and process)."""
    name = scheme(path)
    protocol, package, extra = REMOTE[name]
    try:
        import fsspec

        # no listing cache: other processes and hosts write the same prefixes
        return fsspec.filesystem(protocol, use_listings_cache=False)
    except ImportError:
        raise PathError(f"{path}: {name}:// paths need {package}: pip install "
                        f"'elmo-jax[{extra}]'") from None


def forget_listings(path) -> None:
    """Drop what the file system of orbax's paths (etils' epath, over fsspec)
    remembers of the bucket's listings: it keeps them for the process's life,
    and another process (a run's other hosts, a rerun) may have written since."""
    if not is_remote(path):
        return
    import fsspec

    protocol = REMOTE[scheme(path)][0]
    kwargs = {"finalize_on_close": True} if protocol == "gcs" else {}
    fsspec.filesystem(protocol, **kwargs).invalidate_cache()


@contextlib.contextmanager
def storage_errors(path):
    """Turn a remote client's exceptions into one StorageError line."""
    try:
        yield
    except (UserError, FileNotFoundError, FileExistsError, IsADirectoryError):
        raise
    except Exception as e:
        raise storage_error(path, e) from None


def storage_error(path, e: BaseException) -> StorageError:
    text = f"{type(e).__name__}: {e}".lower()
    bucket = str(path).split("/")[2] if is_remote(path) else ""
    if isinstance(e, PermissionError) or "403" in text or "forbidden" in text \
            or "access denied" in text or "permission" in text:
        why = (f"no permission for {path}: give this machine's account access to the bucket "
               f"{bucket}")
    elif "401" in text or "credential" in text or "unauthori" in text or "token" in text:
        why = (f"no credentials for {path}: set GOOGLE_APPLICATION_CREDENTIALS (gs://) or "
               "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (s3://), or run on a machine "
               "whose service account has access")
    elif "nosuchbucket" in text or "bucket does not exist" in text or "no such bucket" in text:
        why = f"the bucket {bucket} of {path} does not exist: create it, or check its name"
    elif "quota" in text or "429" in text or "insufficient storage" in text or "507" in text:
        why = f"{path}: the storage quota is exhausted ({first_line(e)})"
    else:
        return StorageError(f"{path}: the storage service failed ({type(e).__name__}: "
                            f"{first_line(e)}); nothing was lost: run the same command again "
                            "once it answers", transient=True)
    return StorageError(why)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else repr(e)


def _ask(path, question: str) -> bool:
    """os.path's `question` ("exists", "isdir", "isfile") of a local path, or
    the bucket's of an object path (a missing bucket is a StorageError)."""
    path = check(path)
    if not is_remote(path):
        return getattr(os.path, question)(path)
    with storage_errors(path):
        return _bucket_checked(path, getattr(filesystem(path), question)(path))


def exists(path) -> bool:
    return _ask(path, "exists")


def isdir(path) -> bool:
    return _ask(path, "isdir")


def isfile(path) -> bool:
    return _ask(path, "isfile")


def _bucket_checked(path: str, found: bool) -> bool:
    """`found`, after making sure that a path not found is not a bucket that
    does not exist (which every client reports as a path not found)."""
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
            _bucket_checked(pattern, False)
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
            _bucket_checked(path, False)
            return []


def open(path, mode: str = "rb", **kwargs):  # noqa: A001 (the name says what it is)
    """A file object of `path`: local, or a bucket object (read: streamed in
    blocks; write: uploaded when closed; prefer `files.atomic_path` for
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


RETRY_ENV = "ELMO_JAX_STORAGE_RETRY_SECONDS"
RETRY_SECONDS = 300.0  # a bucket's transient outage outlasted by elmo-jax's writes


def retry_seconds() -> float:
    """How long a write to a bucket is tried again while the storage service
    fails: $ELMO_JAX_STORAGE_RETRY_SECONDS, else 300 (beyond the clients' own
    retries, which outlast a blip of seconds)."""
    try:
        return max(0.0, float(os.environ.get(RETRY_ENV, RETRY_SECONDS)))
    except ValueError:
        raise PathError(f"{RETRY_ENV} must be a number of seconds, got "
                        f"{os.environ[RETRY_ENV]!r}") from None


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
        from elmo_jax.files import atomic_path

        with atomic_path(path) as tmp, builtins.open(tmp, "wb") as fh:
            fh.write(data)
        return
    fs = filesystem(path)

    def pipe():
        with storage_errors(path):
            fs.pipe_file(path, data)
    retry(pipe, path)


def version(path) -> tuple[int, str]:
    """(size, what changes when the file changes): a local file's mtime, an
    object's generation (or ETag), asked afresh (no listing cache)."""
    path = check(path)
    if not is_remote(path):
        st = os.stat(path)
        return st.st_size, str(st.st_mtime_ns)
    with storage_errors(path):
        info = filesystem(path).info(path)
    changes = info.get("generation") or info.get("ETag") or info.get("etag") \
        or info.get("mtime") or info.get("LastModified") or info.get("updated")
    return int(info.get("size")), str(changes)


def identity(path) -> str:
    """`version(path)` as one string, for cache keys."""
    size, changes = version(path)
    return f"{size}-{changes}"


def local_cache_root() -> str:
    """The local cache: $ELMO_JAX_CACHE when it is a local path, else
    ~/.cache/elmo-jax (under $XDG_CACHE_HOME if set)."""
    root = os.environ.get("ELMO_JAX_CACHE")
    if not root or is_remote(root):
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "elmo-jax")
    return check(root)


def local_cache_dir() -> str:
    """The local folder of downloaded copies of bucket objects."""
    return os.path.join(local_cache_root(), "objects")


def local_copy(path) -> str:
    """A local file with `path`'s contents: `path` itself when local, else the
    object downloaded once into `local_cache_dir()` under a name of its URL
    and identity (a new generation is a new copy; the copy appears whole)."""
    path = check(path)
    if not is_remote(path):
        return path
    key = hashlib.sha256(f"{path}\0{identity(path)}".encode()).hexdigest()[:24]
    dest = os.path.join(local_cache_dir(), key, basename(path))
    if os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".download.", dir=os.path.dirname(dest))
    os.close(fd)
    def get():
        with storage_errors(path):
            filesystem(path).get_file(path, tmp)
    try:
        retry(get, path)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def local_copies(files: list[str], workers: int = 8) -> list[str]:
    """`local_copy` of each file, the downloads `workers` at a time (a bucket
    answers many requests at once far faster than one after another)."""
    if not any(is_remote(f) for f in files):
        return [check(f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(local_copy, files))


def size(path) -> int:
    path = check(path)
    if not is_remote(path):
        return os.path.getsize(path)
    with storage_errors(path):
        return int(filesystem(path).info(path)["size"])


def local_copy_tree(path) -> str:
    """A local folder with the objects under the bucket prefix `path` (each
    a `local_copy`, linked into one folder of the prefix's identity); `path`
    itself when local."""
    path = check(path)
    if not is_remote(path):
        return path
    name, fs = scheme(path), filesystem(path)
    with storage_errors(path):
        found = fs.find(path, detail=True)
    if not found:
        _bucket_checked(path, False)
        raise FileNotFoundError(f"no files under {path}")
    root = path.split("://", 1)[1].rstrip("/") + "/"
    entries = sorted((p[len(root):], f"{info.get('size')}-{info.get('generation') or info.get('ETag')}")
                     for p, info in found.items() if p.startswith(root))
    key = hashlib.sha256(repr((path, entries)).encode()).hexdigest()[:24]
    dest = os.path.join(local_cache_dir(), key, basename(path))
    if not os.path.isdir(dest):
        tmp = tempfile.mkdtemp(prefix=".download.", dir=_made(os.path.dirname(dest)))
        try:
            for rel, _ in entries:
                target = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(local_copy(f"{name}://{root}{rel}"), target)
            os.replace(tmp, dest)
        except FileExistsError:  # another process made it meanwhile
            pass
        except OSError:
            if not os.path.isdir(dest):
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _made(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    return folder


def retry(fn, path, *, seconds: float | None = None, first_wait: float = 1.0):
    """`fn()`, tried again with backoff for up to `seconds` (default
    `retry_seconds()`) while the storage service fails (a transient outage);
    past that its StorageError, which says how long it was tried."""
    seconds = retry_seconds() if seconds is None else seconds
    deadline, wait = time.monotonic() + seconds, first_wait
    while True:
        try:
            return fn()
        except StorageError as e:
            if not e.transient:
                raise
            if time.monotonic() + wait > deadline:
                raise StorageError(f"{e} (tried for {seconds:g} s: {RETRY_ENV})") from None
        time.sleep(wait)
        wait = min(wait * 2, 30.0)


class Mirror:
    """A local folder that stands for a folder in a bucket, for writers that
    append or write by name (the metrics log, TensorBoard's event files, a
    profiler trace): `sync()` uploads each file changed since the last sync,
    whole, so the bucket's copy is always a complete earlier state of it. For
    a local `folder` it is that folder and `sync` does nothing."""

    def __init__(self, folder: str, fetch: tuple[str, ...] = ()):
        """`fetch`: names of files to download first, to be appended to."""
        self.remote = check(folder)
        if not is_remote(self.remote):
            self.local = self.remote
            return
        self.local = tempfile.mkdtemp(prefix="elmo-jax-mirror-")
        self._synced: dict[str, tuple[int, int]] = {}
        for name in fetch:
            if exists(join(self.remote, name)):
                with storage_errors(self.remote):
                    filesystem(self.remote).get_file(join(self.remote, name),
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
                    upload(os.path.join(self.local, rel), join(self.remote, *rel.split(os.sep)))
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
    folder = check(folder)
    if not is_remote(folder):
        os.makedirs(folder, exist_ok=True)
        yield folder
        return
    exists(folder)  # a missing bucket is said before anything is written
    mirror = Mirror(folder)
    try:
        yield mirror.local
        mirror.sync()
    finally:
        shutil.rmtree(mirror.local, ignore_errors=True)
