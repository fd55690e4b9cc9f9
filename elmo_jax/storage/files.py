"""Text files as elmo-jax reads and writes them: lines as bilm-tf reads them
(\n only), JSON with clear errors, text written whole (`paths.atomic_path`)
and lines appended (a bucket's object rewritten whole)."""
from __future__ import annotations

import json
import os

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


def write_text(path: str | os.PathLike, text: str) -> None:
    with paths.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
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
