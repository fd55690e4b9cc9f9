"""Models by name or URL: cached, verified downloads (`resolve`).

    resolve("original")                      a registry name (`registry.py`)
    resolve("bilm-tf-tiny")                  a model shipped in the package (`SHIPPED`)
    resolve("https://.../x_weights.hdf5", options="https://.../x_options.json")
    resolve("https://.../179.zip")            an archive of a model folder
    resolve("/path/to/model.zip")             a local archive (extracted once)
    resolve("/path/to/folder")                anything else local: returned as is

A path that exists wins over a registry name of the same spelling.

Everything goes under the cache, `$ELMO_JAX_CACHE`, else
`${XDG_CACHE_HOME:-~/.cache}/elmo-jax`:

    models/NAME/          a registry model: options.json, weights.hdf5 [, vocab.txt,
                          softmax.hdf5] (an export folder), or an archive's model
    urls/KEY/             a model given by URL (KEY: a digest of its URLs)
    extracted/KEY/        a local archive's contents

Downloads are verified and cached as `downloads.py` says (digests, a lock,
a bucket as a cache shared by a pod's hosts, offline use, a mirror).
"""
from __future__ import annotations

import hashlib
import os
import re
import tarfile
import urllib.parse
import zipfile

from elmo_jax.storage import copies, paths
from elmo_jax.formats.downloads import DownloadError, cache_dir, fetch, fetch_file, file_lock
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.formats.registry import REGISTRY, Published

# models in the package itself, for examples that run anywhere (no download)
SHIPPED = {"bilm-tf-tiny": os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                        "shipped_models", "bilm-tf-tiny")}
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def is_url(s) -> bool:
    return isinstance(s, str) and s.split("://", 1)[0].lower() in ("http", "https")


def is_archive(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


# -- resolving ---------------------------------------------------------------


def resolve(model: str | os.PathLike, options: str | os.PathLike | None = None,
            progress: bool = True, softmax: bool = False) -> tuple[str, str | None]:
    """(a local path open_model reads, its options file or None) for a
    registry name, a URL (with `options=` its options URL) or a local path.
    A registry model's vocabulary and softmax (the original's: 1.6 GB) are
    fetched only with `softmax` (scoring)."""
    if isinstance(model, str) and model in SHIPPED and not os.path.exists(model):
        if options is not None:
            raise ValueError(f"{model!r} is a shipped model: it brings its own options")
        return SHIPPED[model], None
    if isinstance(model, str) and model in REGISTRY and not os.path.exists(model):
        if options is not None:
            raise ValueError(f"{model!r} is a registry name: it brings its own options")
        return fetch_published(REGISTRY[model], progress, softmax), None
    if is_url(model):
        return _fetch_url_model(str(model), options, progress)
    if paths.is_remote(model):
        return _remote_model(paths.check(model), options)
    path = os.fspath(model)
    if not os.path.exists(path):
        if isinstance(model, str) and os.sep not in path and not path.startswith("."):
            close = [n for n in REGISTRY if n.split("-")[-1] == path.split("-")[-1]][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise MissingFile(f"{path!r} is neither a file, a folder, a URL nor a "
                                    f"model name{hint}; `elmo-jax models` lists the names")
        raise MissingFile(f"model not found: {path}")
    if os.path.isfile(path) and is_archive(path):
        st = os.stat(path)
        key = _key(os.path.abspath(path), st.st_size, st.st_mtime_ns)
        return _extracted(path, os.path.join(cache_dir(), "extracted", key)), None
    if options is not None and is_url(options):
        return path, fetch(str(options), _url_dir([options]) + "/options.json", None,
                           progress=progress)
    return path, None if options is None else os.fspath(options)


def _remote_model(path: str, options) -> tuple[str, str | None]:
    """A model in a bucket: a training workdir is read where it is (orbax
    reads its checkpoint); any other form is copied into the local cache once
    (`copies.local_copy`, keyed by the objects' identities) and read there."""
    options = None if options is None else (
        fetch(str(options), _url_dir([options]) + "/options.json", None) if is_url(options)
        else copies.local_copy(options))
    if paths.isdir(path):
        if (paths.exists(paths.join(path, "config.json"))
                and paths.isdir(paths.join(path, "checkpoints"))):
            return path, options
        return copies.local_copy_tree(path), options
    if not paths.exists(path):
        raise MissingFile(f"model not found: {path}")
    local = copies.local_copy(path)
    if is_archive(local):
        return resolve(local, options)
    if options is None:  # a weights file: its options.json beside it, as locally
        beside = paths.join(paths.dirname(path), "options.json")
        options = copies.local_copy(beside) if paths.exists(beside) else None
    return local, options


class UnsupportedModel(UserError, ValueError):
    """A published model of another architecture than ELMo's LSTM biLM."""


def fetch_published(model: Published, progress: bool = True, softmax: bool = False) -> str:
    """The local folder of a registry model, downloading what is missing (the
    vocabulary and softmax only with `softmax`)."""
    if model.kind == "unsupported":
        raise UnsupportedModel(f"{model.name} is not supported: {model.note}")
    folder = os.path.join(cache_dir(), "models", model.name)
    if model.kind == "archive":
        f = model.file("archive")
        archive = fetch_file(f, os.path.join(folder, "archive" + _suffix(model.url("archive"))),
                             model, progress)
        return _extracted(archive, os.path.join(folder, "model"))
    names = {"options": "options.json", "weights": "weights.hdf5", "vocab": "vocab.txt",
             "softmax": "softmax.hdf5"}
    for f in model.files:
        if f.role in ("vocab", "softmax") and not softmax:
            continue
        fetch_file(f, os.path.join(folder, names[f.role]), model, progress)
    return folder


def _fetch_url_model(url: str, options, progress: bool) -> tuple[str, str | None]:
    folder = _url_dir([url, options])
    if is_archive(urllib.parse.urlsplit(url).path):
        archive = fetch(url, os.path.join(folder, "archive" + _suffix(url)), None,
                        progress=progress)
        return _extracted(archive, os.path.join(folder, "model")), None
    weights = fetch(url, os.path.join(folder, "weights.hdf5"), None, progress=progress)
    if options is None:
        raise ValueError(f"{url} is a weights file: give its options file too "
                         "(options=URL, or --options URL), as AllenNLP's Elmo takes both")
    if is_url(options):
        fetch(str(options), os.path.join(folder, "options.json"), None, progress=progress)
        return weights, os.path.join(folder, "options.json")
    return weights, os.fspath(options)


def _url_dir(urls) -> str:
    return os.path.join(cache_dir(), "urls", _key(*[str(u) for u in urls]))


def _key(*parts) -> str:
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def _suffix(url: str) -> str:
    """The archive suffix of `url` (of the whole, for a part's `.tgz.part-00`)."""
    path = re.sub(r"\.part-?\d+$", "", urllib.parse.urlsplit(url).path.lower())
    return next((s for s in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True)
                 if path.endswith(s)), "")


# -- archives ------------------------------------------------------------------


def _extracted(archive: str, target: str) -> str:
    """The model folder inside `archive`, extracted (once) into `target`."""
    done = os.path.join(target, ".complete")
    if not os.path.exists(done):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with file_lock(target + ".lock"):
            if not os.path.exists(done):
                with paths.atomic_dir(target, replace=True) as tmp:
                    extract_archive(archive, tmp)
                    with open(os.path.join(tmp, ".complete"), "w") as fh:
                        fh.write(archive + "\n")
    return model_root(target)


def extract_archive(archive: str, out_dir: str) -> None:
    """Extract a zip or tar (gz, bz2, xz) archive into `out_dir`, refusing any
    member that would land outside it (absolute paths, `..`, links)."""
    root = os.path.realpath(out_dir)

    def inside(name: str) -> bool:
        target = os.path.realpath(os.path.join(root, name))
        return target == root or target.startswith(root + os.sep)

    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if not inside(name):
                        raise DownloadError(f"{archive}: member {name!r} would be written "
                                            "outside the folder; refused")
                z.extractall(root)
            return
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if not inside(m.name) or m.issym() or m.islnk() or m.isdev():
                    raise DownloadError(f"{archive}: member {m.name!r} would be written "
                                        "outside the folder, or is a link; refused")
            t.extractall(root, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as e:
        raise DownloadError(f"{archive}: not a readable zip or tar archive, or truncated "
                            f"({e}); delete it to fetch it again") from None


def model_root(folder: str) -> str:
    """The model in `folder`: at its top, or in its one sub-folder."""
    entries = [e for e in os.listdir(folder) if not e.startswith(".") and e != "__MACOSX"]
    if any(os.path.isfile(os.path.join(folder, e)) for e in entries):
        return folder
    dirs = [e for e in entries if os.path.isdir(os.path.join(folder, e))]
    if len(dirs) == 1:
        return model_root(os.path.join(folder, dirs[0]))
    raise DownloadError(f"{folder}: no model at the archive's top and not one folder "
                        f"({len(dirs)} folders)")
