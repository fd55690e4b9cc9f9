"""Reading the corpus: its lines in chunks of `chunk_lines` (the unit of
resuming), only the chunks a worker wants decoded, memory bounded by one
chunk; a bucket's objects streamed."""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

from elmo_jax.storage import paths
from elmo_jax.data.sources import DataError


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
        from elmo_jax.data.segmentation import tokenize_lines

        tokens = tokenize_lines(texts, lang=tokenize)
    else:
        tokens = [t.split() for t in texts]
    return Chunk(index, first, tokens, [len(r) for r in raw_lines], skipped)
