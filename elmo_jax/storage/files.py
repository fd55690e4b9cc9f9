"""Lines as bilm-tf reads them, JSON with clear errors, and writing files whole: every file elmo-jax writes appears complete or not at
all (a crash leaves no half-written file), with the permissions the umask
gives (shared machines: a colleague can read what you wrote when your umask
says so)."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile

from elmo_jax.storage import paths
from elmo_jax.errors import MissingFile


def split_lines(text: str) -> list[str]:
    """The lines of a text: split on "\n" only, a "\r" before it dropped.

    Line i of a file is entry i of every output made from it, so no other
    character ends a line: Python's `str.splitlines` also breaks on \r, \v, \f,
    \x1c-\x1e, \x85, U+2028 and U+2029, which would shift every later line. A
    final "\n" ends the last line and starts no empty one."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _umask() -> int:
    """The process's umask, read without setting it: setting it to read it
    (os.umask's only way) gives a file that another thread creates meanwhile
    (orbax's, the metrics writer's) the mode 0666. Linux states it in
    /proc/self/status; elsewhere it is read once, at the first call."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
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
    path = paths.check(path)
    if paths.is_remote(path):
        with _remote_atomic_path(path) as tmp:
            yield tmp
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def create_exclusively(path: str, text: str) -> bool:
    """Write `text` as the new file or object `path`, whole, unless one is
    there already (then False). Locally a temporary file beside it is linked
    into place (a link, unlike a rename, fails where a file is); in a bucket
    the service refuses the second (`paths.create_new`)."""
    if paths.is_remote(path):
        return paths.create_new(path, text.encode("utf-8"))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


@contextlib.contextmanager
def _remote_atomic_path(path: str):
    fd, tmp = tempfile.mkstemp(prefix=f".{paths.basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        paths.upload(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append `line` and a newline to the text file `path` (made if missing);
    an object in a bucket, which cannot be appended to, is rewritten whole."""
    if paths.is_remote(path):
        before = paths.read_bytes(path) if paths.exists(path) else b""
        paths.write_bytes(path, before + (line + "\n").encode())
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def write_json(path: str | os.PathLike, obj) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError):
    """The JSON in `path`; a missing file or bad JSON is an error naming it."""
    try:
        with paths.open(path, "rb") as fh:
            return json.loads(fh.read().decode("utf-8"))
    except FileNotFoundError:
        raise MissingFile(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
