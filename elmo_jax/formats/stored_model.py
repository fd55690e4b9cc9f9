"""Open a stored model, whatever form it has: `open_model(path)`.

    a registry name      "original", "manylangs-zhs", ... (`elmo-jax models`; `hub.py`
                         downloads it once into the cache)
    a URL                a weights file's (with `options=` its options file's URL), or
                         an archive's (zip, tar.gz, tar.bz2, tar.xz) holding a model
    a training workdir   WORKDIR/config.json, vocab.txt, checkpoints/STEP/params (the newest)
    an export folder     DIR/options.json, weights.hdf5 [, vocab.txt, softmax.hdf5,
                         lexicon.json]
    an NLPL model folder DIR/options.json, model.hdf5 [, vocab.txt or vocab.txt.gz]
                         (the NLPL repository's zips of bilm-tf models)
    a weights hdf5       with options.json beside it, or `options=` (the published
                         ELMo files are named *_weights.hdf5 and *_options.json)
    an ELMoForManyLangs  DIR/config.json naming its cnn config, char.dic, word.dic and
    model folder         the two torch pickles (`manylangs.py`); told apart from a
                         workdir by its config.json's content
    a local archive      of any folder above (extracted once into the cache)

Every reader of a model opens it here: the embed and score commands,
`Elmo.from_pretrained`, the Flax modules' `from_pretrained`, `train.py export` and
`eval`, and fine-tuning's `data.init_from`. Opening a workdir reads the
parameters item of its checkpoint and builds nothing of training.
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple

from elmo_jax.formats import checkpoints
from elmo_jax.storage import paths
from elmo_jax.formats.checkpoints import CheckpointError
from elmo_jax.config import Config, ConfigError, config_from_dict
from elmo_jax.formats.export import VOCAB_FILE, load_export
from elmo_jax.formats.hub import resolve
from elmo_jax.core.lexicon import Lexicon
from elmo_jax.formats.manylangs import is_manylangs, read_manylangs
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.softmax import unpad_softmax
from elmo_jax.core.vocab import Vocabulary

CONFIG_FILE = "config.json"  # a training workdir's resolved config


class StoredModel(NamedTuple):
    """What `open_model` returns.

    Attributes:
        options: the model's `ElmoOptions`.
        params: the biLM's parameters (numpy float32).
        vocab: the softmax's words (a `vocab.Vocabulary`), where stored.
        softmax: {"w": [V, P], "b": [V]} float32, where stored.
        kind: "workdir", "export", "weights" or "manylangs".
        step: a workdir's checkpoint step.
        config: a workdir's resolved `Config`.
        lexicon: the dictionaries of a model that spells with them.
        path: where it was read from (a download: in the cache).
    """
    options: ElmoOptions
    params: dict
    vocab: Vocabulary | None
    softmax: dict | None
    kind: str
    step: int | None = None
    config: Config | None = None
    lexicon: Lexicon | None = None
    path: str | None = None


def is_workdir(path: str | os.PathLike) -> bool:
    """Whether `path` is a training workdir (it holds a run's config.json)."""
    return (paths.isdir(path) and paths.exists(paths.join(path, CONFIG_FILE))
            and not is_manylangs(path))


def read_run(workdir: str) -> tuple[Config, Vocabulary]:
    """The resolved config and the vocabulary of the run in `workdir`."""
    path = paths.join(workdir, CONFIG_FILE)
    if not paths.exists(path):
        raise CheckpointError(f"{workdir} holds no training run (no {CONFIG_FILE})")
    try:
        config = config_from_dict(json.loads(paths.read_text(path)))
    except (ConfigError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    return config, Vocabulary.from_file(paths.join(workdir, VOCAB_FILE))


def open_model(path: str | os.PathLike, options: str | os.PathLike | None = None,
               step: int | None = None, progress: bool = True,
               softmax: bool = False) -> StoredModel:
    """The one way to open a model.

    Args:
        path: a registry name (`elmo-jax models`), a URL, or a stored model,
            local or in a bucket: an export folder, a weights hdf5 (with its
            options.json beside it), a training workdir, an ELMoForManyLangs
            folder, or an archive of one of them.
        options: the options.json of a weights file (a path or a URL).
        step: a workdir's checkpoint (default: the newest).
        progress: show download progress.
        softmax: also fetch a registry model's vocabulary and softmax, where
            it has them (scoring needs them; the original's is 1.6 GB).

    Returns:
        A `StoredModel`: `options`, `params`, `vocab`, `softmax`, `lexicon`,
        `kind` ("export", "weights", "workdir", "manylangs") and `step`.
    """
    path, options = resolve(path, options, progress, softmax)
    if is_manylangs(path):
        if options is not None:
            raise ConfigError(f"{path} is an ELMoForManyLangs model: it brings its own config")
        m = read_manylangs(path)
        return StoredModel(m.options, m.params, None, None, "manylangs", lexicon=m.lexicon,
                           path=path)
    if is_workdir(path):
        if options is not None:
            raise ConfigError(f"{path} is a training workdir: its options are its config.json")
        config, vocab = read_run(path)
        step, params = checkpoints.read_params(path, step)
        lexicon = Lexicon.load(path) if config.model.char_cnn.spelling == "lexicon" else None
        return StoredModel(config.model, params["bilm"], vocab,
                           unpad_softmax(params["softmax"], len(vocab)), "workdir", step, config,
                           lexicon=lexicon, path=path)
    exported = load_export(path, options)
    return StoredModel(exported.options, exported.params, exported.vocab, exported.softmax,
                       "export" if os.path.isdir(path) else "weights", lexicon=exported.lexicon,
                       path=path)
