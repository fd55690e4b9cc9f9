"""Raw text -> tokens: `tokenize(line, lang="en" | "zh")`.

en: the Moses tokeniser (sacremoses), as the English corpus recipes use it.
zh: jieba's word segmentation (the `elmo-jax[zh]` extra), whose words are the
    biLM's tokens; whitespace is dropped, Latin words and numbers inside
    Chinese text stay whole ("我用ELMo模型" gives 我用 / ELMo / 模型, "JAX 0.10"
    JAX / 0.10), and full-width punctuation (，。！？) is a token of its own.

`tokenize_lines` segments many lines at once (a corpus is segmented once, by
the recipe or `train.py vocab`, and the result kept: never per epoch).
"""
from __future__ import annotations

from typing import Iterable

from elmo_jax.errors import UserError

LANGS = ("en", "zh")


class SegmentationError(UserError, RuntimeError):
    """A tokeniser that cannot run here (a missing package); says what to install."""


def _jieba():
    try:
        import jieba
    except ImportError:
        raise SegmentationError("Chinese segmentation needs jieba: pip install 'elmo-jax[zh]' "
                                "(or pip install jieba)") from None
    jieba.setLogLevel(60)  # no "Building prefix dict" chatter on stderr
    return jieba


_MOSES = None


def tokenize(line: str, lang: str = "en") -> list[str]:
    """The tokens of one line of raw text (see the module docstring).

    Args:
        line: raw text, one sentence or line.
        lang: "en" (the Moses tokeniser) or "zh" (jieba, the `elmo-jax[zh]`
            extra).

    Returns:
        The tokens, [] for a blank line.

    Raises:
        ValueError: an unknown `lang`.
        SegmentationError: jieba is not installed (for "zh").
    """
    return tokenize_lines([line], lang)[0]


def tokenize_lines(lines: Iterable[str], lang: str = "en") -> list[list[str]]:
    """The tokens of each line (a blank line gives [])."""
    global _MOSES
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    if lang == "zh":
        jieba = _jieba()
        return [[w for w in jieba.cut(line) if w.strip()] for line in lines]
    if _MOSES is None:
        from elmo_jax.data.recipes.common import Tokenizer

        _MOSES = Tokenizer()
    return [_MOSES.words(line) if line.strip() else [] for line in lines]


def segmented_files(pattern: str, lang: str) -> str:
    """A glob of the files matching `pattern`, each line tokenised with `lang`:
    written once into the cache (`downloads.cache_dir()/segmented/KEY/`, KEY a digest
    of the files' paths, sizes and times and of `lang`) and reused by every
    later run, epoch and process, as long as the files are unchanged."""
    import hashlib
    import os

    from elmo_jax.storage import copies, paths
    from elmo_jax.data.sources import list_shards
    from elmo_jax.storage.files import split_lines
    from elmo_jax.storage.paths import atomic_path
    from elmo_jax.formats.downloads import cache_dir, file_lock

    if lang not in LANGS:
        raise ValueError(f"tokenize must be one of {LANGS}, got {lang!r}")
    files = list_shards(pattern)
    digest = hashlib.sha256(lang.encode())
    for p in files:
        if paths.is_remote(p):  # its size and generation
            digest.update(f"\n{p}\t{paths.identity(p)}".encode())
        else:
            st = os.stat(p)
            digest.update(f"\n{os.path.abspath(p)}\t{st.st_size}\t{st.st_mtime_ns}".encode())
    root = cache_dir() if not paths.is_remote(cache_dir()) else copies.local_cache_root()
    out = os.path.join(root, "segmented", digest.hexdigest()[:16])
    done = os.path.join(out, "DONE")
    if not os.path.exists(done):
        os.makedirs(out, exist_ok=True)
        with file_lock(os.path.join(out, ".lock")):
            if not os.path.exists(done):
                for i, p in enumerate(files):
                    with open(copies.local_copy(p), encoding="utf-8", errors="strict") as fh:
                        lines = split_lines(fh.read())
                    tokens = tokenize_lines(lines, lang)
                    target = os.path.join(out, f"{i:05d}-{paths.basename(p)}")
                    with atomic_path(target) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                        fh.writelines(" ".join(t) + "\n" for t in tokens)
                with open(done, "w", encoding="utf-8") as fh:
                    fh.write("\n".join(files) + "\n")
    return os.path.join(out, "*-*")
