"""Verified downloads into the model cache (`hub.py` resolves names and URLs
to them).

The cache is `$ELMO_JAX_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/elmo-jax`.
A registry file's URLs are tried in order (`fetch_file`); a file published in
parts is fetched part by part and joined. A file is downloaded to a temporary
name beside its place and renamed there only when whole: its size equal to
the server's Content-Length (and the registry's, where it records one), its
MD5, SHA-1 and SHA-256 equal to the publisher's where the registry records
them. `NAME.sha256` beside it records the digests and the URL; a file without
one, or whose size or digests no longer match, is fetched again. A lock file
(`fcntl.flock`) makes concurrent processes (a pod's hosts on a shared disk,
pytest workers) download once: the others wait, then find it there.

`ELMO_JAX_CACHE=gs://bucket/prefix` (or s3://) is a cache shared by hosts
that share no disk (a pod's): files are read and written locally under
`${XDG_CACHE_HOME:-~/.cache}/elmo-jax` as above, and each verified download
is also uploaded to the same place under the prefix (the file, then its
record); a host that misses locally takes the bucket's copy when its record
matches, before downloading. Hosts that start together may each download
once (a bucket has no lock); the objects they write are the same.

`ELMO_JAX_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) uses the cache only and names
what is missing; `ELMO_JAX_ENDPOINT=http://host:port` fetches every registry
URL from that server at the same path (a mirror; each alternative at its own).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

from elmo_jax.storage import copies, paths
from elmo_jax import environment
from elmo_jax.errors import UserError
from elmo_jax.storage.files import write_json
from elmo_jax.formats.registry import File, Published

_CHUNK = 1 << 20
TIMEOUT_S = 60


class DownloadError(UserError, OSError):
    """A model that could not be fetched or used; names the URL and what to do."""


def cache_dir() -> str:
    """The local cache folder (`$ELMO_JAX_CACHE` when it is local)."""
    return os.path.abspath(os.path.expanduser(copies.local_cache_root()))


def shared_cache() -> str | None:
    """`$ELMO_JAX_CACHE` when it is a bucket prefix, else None."""
    root = environment.cache_setting()
    return paths.check(root).rstrip("/") if root and paths.is_remote(root) else None


def mirrored(url: str) -> str:
    """`url` at `$ELMO_JAX_ENDPOINT`'s host, same path (unchanged without it)."""
    endpoint = environment.endpoint()
    if not endpoint:
        return url
    parts = urllib.parse.urlsplit(url)
    return endpoint.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")


def fetch_file(file: File, dest: str, model: Published | None = None,
               progress: bool = True, share: bool = True) -> str:
    """`file` at `dest`: its URLs tried in order (each at the mirror, with
    ELMO_JAX_ENDPOINT), or its parts fetched and joined; its size and digests
    checked. When no URL gives it, one error names every URL and why, and
    the model's note (links reported dead, copies users found)."""
    if _cached(dest, file):
        return dest
    if file.parts:
        return _joined(file, dest, model, progress)
    failures = []
    for url in file.urls:
        try:
            return fetch(mirrored(url), dest, file, progress=progress, shown=url, share=share)
        except DownloadError as e:
            if environment.offline():
                raise
            failures.append(str(e))
    note = f" ({model.name}: {model.note})" if model is not None and model.note else ""
    if len(failures) == 1:
        raise DownloadError(failures[0] + note)
    raise DownloadError(f"no source gave {os.path.basename(dest)}: " + "; ".join(
        f"[{i + 1}] {f}" for i, f in enumerate(failures)) + note)


def _joined(file: File, dest: str, model: Published | None, progress: bool) -> str:
    """A file published in parts: each part fetched and checked, then joined
    into `dest` and the whole checked; the parts removed."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with file_lock(dest + ".lock"):
        if _cached(dest, file) or _from_shared(dest, file):
            return dest
        parts = [fetch_file(p, f"{dest}.part-{i:02d}", model, progress, share=False)
                 for i, p in enumerate(file.parts)]
        shown = f"{file.parts[0].urls[0]} (and its {len(parts) - 1} other parts, joined)"
        digests = _write_checked(dest, (chunk for part in parts for chunk in _file_chunks(part)),
                                 file, shown)
        write_json(_record_path(dest), {"url": file.parts[0].urls[0], **digests,
                                        "size": os.path.getsize(dest)})
        for part in parts:
            for p in (part, _record_path(part), part + ".lock"):
                if os.path.exists(p):
                    os.unlink(p)
    _to_shared(dest)
    return dest


def fetch(url: str, dest: str, expected: File | None = None, progress: bool = True,
          shown: str | None = None, share: bool = True) -> str:
    """Download `url` to `dest` unless a whole, verified copy is there (or in
    the shared cache). `expected` gives the registry's size and digests to
    check; `shown` the URL to name in messages (the registry's, when fetched
    from a mirror); `share`: upload it to the shared cache too."""
    shown = shown or url
    if _cached(dest, expected) or (share and _from_shared(dest, expected)):
        return dest
    if environment.offline():
        raise DownloadError(f"offline (ELMO_JAX_OFFLINE / HF_HUB_OFFLINE is set) and {shown} "
                            f"is not in the cache ({dest}): run once with a network, or "
                            "copy the file there")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with file_lock(dest + ".lock"):
        if _cached(dest, expected):  # another process fetched it while we waited
            return dest
        digests = _download(url, dest, expected, progress, shown)
        write_json(_record_path(dest), {"url": shown, **digests,
                                        "size": os.path.getsize(dest)})
    if share:
        _to_shared(dest)
    return dest


def _shared_twin(dest: str) -> str | None:
    """`dest`'s place in the shared cache (None without one, or for a file
    outside the local cache)."""
    shared, rel = shared_cache(), os.path.relpath(dest, cache_dir())
    if shared is None or rel.startswith(".."):
        return None
    return paths.join(shared, *rel.split(os.sep))


def _from_shared(dest: str, expected: File | None) -> bool:
    """Take the shared cache's copy of `dest` when it is whole there (its
    record is written after it) and matches `expected`; True if taken."""
    twin = _shared_twin(dest)
    if twin is None or not paths.exists(_record_path(twin)):
        return False
    try:
        record = json.loads(paths.read_text(_record_path(twin)))
    except ValueError:
        return False
    if expected is not None and not (
            (expected.size is None or record.get("size") == expected.size)
            and all(record.get(k) == v for k, v in expected.digests.items())):
        return False
    paths.download(twin, dest)
    hashes = _hashes()
    for chunk in _file_chunks(dest):
        for h in hashes.values():
            h.update(chunk)
    if (record.get("size") != os.path.getsize(dest)
            or any(record.get(k) != h.hexdigest() for k, h in hashes.items())):
        os.unlink(dest)  # the object is not what its record says: fetch it again
        return False
    write_json(_record_path(dest), record)
    return _cached(dest, expected)


def _to_shared(dest: str) -> None:
    """Upload `dest` to the shared cache, its record last (a host that sees
    the record finds the file whole)."""
    twin = _shared_twin(dest)
    if twin is not None:
        paths.upload(dest, twin)
        paths.upload(_record_path(dest), _record_path(twin))


def _record_path(dest: str) -> str:
    return dest + ".sha256"


def _cached(dest: str, expected: File | None) -> bool:
    """A whole copy: there, with its record, of the recorded size (and the
    registry's size and digests, where it has them)."""
    if not (os.path.exists(dest) and os.path.exists(_record_path(dest))):
        return False
    try:
        with open(_record_path(dest), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return False
    size = os.path.getsize(dest)
    if record.get("size") != size:
        return False
    if expected is None:
        return True
    if expected.size is not None and size != expected.size:
        return False
    return all(record.get(k) == v for k, v in expected.digests.items())


@contextlib.contextmanager
def file_lock(path: str):
    """An exclusive lock on `path` (created if missing) for the block."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _hashes() -> dict:
    return {"md5": hashlib.md5(), "sha1": hashlib.sha1(), "sha256": hashlib.sha256()}


def _check(shown: str, got: int, hashes: dict, expected: File | None) -> dict:
    """The digests of what was fetched, after checking them and its size
    against the registry's."""
    digests = {k: h.hexdigest() for k, h in hashes.items()}
    if expected is None:
        return digests
    if expected.size is not None and got != expected.size:
        raise DownloadError(f"{shown}: got {got} bytes, the registry records "
                            f"{expected.size}: not the published file; nothing was kept")
    for kind, want in expected.digests.items():
        if digests[kind] != want.lower():
            raise DownloadError(f"{shown}: {kind} {digests[kind]} differs from the published "
                                f"{want}: corrupt or not the published file; nothing was kept")
    return digests


def _download(url: str, dest: str, expected: File | None, progress: bool, shown: str) -> dict:
    """Stream `url` into `dest`, checked (`_write_checked`); returns its digests."""
    with _open_url(url, shown) as resp:
        return _write_checked(dest, _response_chunks(resp, dest, progress, shown), expected,
                              shown)


def _response_chunks(resp, dest: str, progress: bool, shown: str):
    """The body of `resp` in chunks, with a progress bar; a body cut short (or
    shorter than its Content-Length) or a stalled server is a DownloadError."""
    total = resp.headers.get("Content-Length")
    total = int(total) if total and total.isdigit() else None
    bar, got = _progress(total, os.path.basename(dest), progress), 0
    try:
        while True:
            try:
                chunk = resp.read(_CHUNK)
            except http.client.IncompleteRead as e:
                got += len(e.partial)
                raise DownloadError(f"{shown}: the download broke off after {got} of "
                                    f"{total} bytes; nothing was kept, run it again") from None
            except (socket.timeout, TimeoutError):
                raise DownloadError(f"{shown}: timed out after {TIMEOUT_S} s without data, "
                                    f"after {got} bytes; nothing was kept, run it again") from None
            if not chunk:
                break
            got += len(chunk)
            bar.update(len(chunk))
            yield chunk
    finally:
        bar.close()
    if total is not None and got != total:
        raise DownloadError(f"{shown}: got {got} bytes, the server announced {total}: the "
                            "download is incomplete; nothing was kept, run it again")


def _file_chunks(path: str):
    with open(path, "rb") as src:
        yield from iter(lambda: src.read(_CHUNK), b"")


def _write_checked(dest: str, chunks, expected: File | None, shown: str) -> dict:
    """Write `chunks` to a temporary file beside `dest`, check its size and
    digests (`_check`), rename it into place; returns its digests. Nothing is
    left behind on an error; a full disk is a DownloadError saying so."""
    hashes, got = _hashes(), 0
    try:
        with paths.atomic_path(dest) as tmp, open(tmp, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                for h in hashes.values():
                    h.update(chunk)
                got += len(chunk)
            digests = _check(shown, got, hashes, expected)  # a mismatch: tmp removed
        return digests
    except OSError as e:
        if isinstance(e, DownloadError):
            raise
        if e.errno == errno.ENOSPC:
            raise DownloadError(f"{shown}: the disk is full writing {dest}; free space or set "
                                "ELMO_JAX_CACHE to a larger disk") from None
        raise DownloadError(f"{shown}: {e}") from None


@contextlib.contextmanager
def _open_url(url: str, shown: str):
    request = urllib.request.Request(url, headers={"User-Agent": "elmo-jax"})
    try:
        resp = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        what = ("not there: the file has moved or the name is wrong"
                if e.code == 404 else "refused by the server")
        raise DownloadError(f"{shown}: HTTP {e.code} {e.reason}, {what}; check "
                            "`elmo-jax models`, or set ELMO_JAX_ENDPOINT to a mirror that has "
                            "it") from None
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"{shown}: cannot reach the server ({reason}); without a network "
                            "set ELMO_JAX_OFFLINE=1 to use the cache, or ELMO_JAX_ENDPOINT "
                            "to a mirror") from None
    with resp:
        yield resp


def _progress(total, name: str, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                disable=not show or not sys.stderr.isatty(), file=sys.stderr)
