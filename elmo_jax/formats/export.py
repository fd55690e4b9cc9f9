"""The export folder: what `train.py export` writes and every reader loads.

    DIR/options.json   bilm-tf's options, as an inference file (n_characters 262)
    DIR/weights.hdf5   the biLM in bilm-tf's hdf5 layout (`weights.py`)
    DIR/vocab.txt      the softmax vocabulary (optional)
    DIR/softmax.hdf5   the word softmax, for scoring sentences (optional)
    DIR/lexicon.json   the character and word dictionaries of a model that spells
                       tokens with them (ELMoForManyLangs', `lexicon.py`)

The pair is exactly what AllenNLP's `Elmo(options_file, weight_file)` and
bilm-tf's `BidirectionalLanguageModel` read; the softmax sits in a file of its
own so that they load the pair unchanged. `load_export` also takes a weights
file with its options.json beside it (the published ELMo files are named
`*_weights.hdf5` and `*_options.json`: pass the weights file and `options=`),
and the NLPL repository's folders of bilm-tf models: model.hdf5 for
weights.hdf5, and vocab.txt or vocab.txt.gz (no softmax: the vocabulary is
kept, and scoring says what is missing).
"""
from __future__ import annotations

import os
import warnings
from typing import NamedTuple

from elmo_jax.storage import copies, paths
from elmo_jax.errors import MissingFile
from elmo_jax.core.lexicon import LEXICON_FILE, Lexicon, LexiconError
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.vocab import VocabError, Vocabulary
from elmo_jax.formats.weights import (WeightsError, load_softmax, load_weights, save_softmax,
                              save_weights)

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
VOCAB_FILE = "vocab.txt"
SOFTMAX_FILE = "softmax.hdf5"
NLPL_WEIGHTS_FILE = "model.hdf5"  # the NLPL repository's name for the weights


class Export(NamedTuple):
    options: ElmoOptions
    params: dict               # biLM parameters (numpy float32)
    vocab: Vocabulary | None   # None when the folder has no vocab.txt
    softmax: dict | None = None  # {"w": [V, P], "b": [V]}; None without softmax.hdf5
    lexicon: Lexicon | None = None  # a lexicon model's dictionaries


def save_export(out_dir: str | os.PathLike, params: dict, options: ElmoOptions,
                vocab: Vocabulary | None = None, softmax: dict | None = None,
                lexicon: Lexicon | None = None) -> str:
    """Write an export folder (docs/formats/export.md): options.json,
    weights.hdf5 and, when given, vocab.txt, softmax.hdf5 and the lexicon.
    Each file appears whole or not at all.

    Args:
        out_dir: the folder (local or in a bucket).
        params: the biLM parameters.
        options: the model's `ElmoOptions`.
        vocab: the softmax's vocabulary (its rows), or None.
        softmax: {"w": [V, P], "b": [V]} float32, or None.
        lexicon: the dictionaries of a model that spells with them (and
            only of such a model).

    Returns:
        `out_dir`.
    """
    out_dir = paths.check(out_dir)
    if (lexicon is not None) != (options.char_cnn.spelling == "lexicon"):
        raise LexiconError("a model that spells with a lexicon is exported with it, and "
                           "only such a model")
    with copies.written_folder(out_dir) as local:
        _write_export(local, params, options, vocab, softmax, lexicon)
    return out_dir


def _write_export(out_dir: str, params, options, vocab, softmax, lexicon) -> None:
    if lexicon is not None:
        lexicon.save(out_dir)
    inference = options.for_inference()
    save_weights(os.path.join(out_dir, WEIGHTS_FILE), params, inference)
    inference.to_json(os.path.join(out_dir, OPTIONS_FILE))
    if vocab is not None:
        vocab.to_file(os.path.join(out_dir, VOCAB_FILE))
    if softmax is not None:
        if vocab is None or len(vocab) != softmax["w"].shape[0]:
            raise WeightsError("the softmax is written with the vocabulary of its rows")
        save_softmax(os.path.join(out_dir, SOFTMAX_FILE), softmax)


def export_files(path: str | os.PathLike, options: str | os.PathLike | None = None
                 ) -> tuple[str, str]:
    """(options.json, weights.hdf5) of an export folder, or of a weights file
    (options.json beside it unless `options` is given)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        weights = os.path.join(path, WEIGHTS_FILE)
        if not os.path.exists(weights) and os.path.exists(os.path.join(path, NLPL_WEIGHTS_FILE)):
            weights = os.path.join(path, NLPL_WEIGHTS_FILE)
        options_path = os.fspath(options) if options else os.path.join(path, OPTIONS_FILE)
    else:
        weights = path
        options_path = os.fspath(options) if options else os.path.join(
            os.path.dirname(os.path.abspath(path)), OPTIONS_FILE)
    for what, p in (("options file", options_path), ("weight file", weights)):
        if not os.path.exists(p):
            raise MissingFile(f"{what} not found: {p} (an export folder holds "
                                    f"{OPTIONS_FILE} and {WEIGHTS_FILE}; an NLPL model "
                                    f"{OPTIONS_FILE} and {NLPL_WEIGHTS_FILE})")
    return options_path, weights


def export_lexicon(opts: ElmoOptions, options_path: str, folder: str) -> Lexicon | None:
    """The lexicon beside an export's weights, for options that spell with one."""
    if opts.char_cnn.spelling != "lexicon":
        return None
    if not os.path.exists(os.path.join(folder, LEXICON_FILE)):
        raise MissingFile(f"{options_path} spells tokens with a lexicon, and "
                                f"{os.path.join(folder, LEXICON_FILE)} is missing")
    lexicon = Lexicon.load(folder)
    if (lexicon.n_characters, lexicon.n_words) != (opts.char_cnn.n_characters,
                                                   opts.char_cnn.n_words):
        raise LexiconError(f"{folder}: {LEXICON_FILE} has {lexicon.n_characters} character "
                           f"and {lexicon.n_words} word rows, the options "
                           f"{opts.char_cnn.n_characters} and {opts.char_cnn.n_words}")
    return lexicon


def load_export(path: str | os.PathLike, options: str | os.PathLike | None = None) -> Export:
    """Read an export folder (or a weights file with its options).

    Args:
        path: an export folder, or a weights hdf5 file.
        options: the options file of a weights file; None finds
            options.json beside it.

    Returns:
        An `Export` (options, params, vocab, softmax, lexicon); vocab and
        softmax are None when the folder has none.

    Raises:
        UserError: a missing or damaged file, weights that do not match the
            options (a softmax that does not match the vocabulary is left
            out, with a warning: the biLM still embeds).
    """
    options_path, weights = export_files(path, options)
    opts = ElmoOptions.from_json(options_path)
    folder = os.path.dirname(weights)
    softmax_path = os.path.join(folder, SOFTMAX_FILE)
    vocab_path = next((p for p in (os.path.join(folder, VOCAB_FILE + gz) for gz in ("", ".gz"))
                       if os.path.exists(p)), None)
    vocab = None
    if vocab_path is not None:
        try:
            vocab = Vocabulary.from_file(vocab_path)
        except VocabError as e:
            if os.path.exists(softmax_path):
                raise
            warnings.warn(f"the vocabulary is left out (there is no softmax): {e}", stacklevel=2)
    softmax = None
    if vocab is not None and os.path.exists(softmax_path):
        try:
            softmax = load_softmax(softmax_path, opts, len(vocab))
        except WeightsError as e:  # an optional file: the biLM still embeds
            warnings.warn(f"the softmax is left out: {e}", stacklevel=2)
    lexicon = export_lexicon(opts, options_path, folder)
    return Export(opts, load_weights(weights, opts), vocab, softmax, lexicon)
