"""HIT-SCIR's ELMoForManyLangs model folders, read natively (no torch).

    DIR/config.json          training arguments; "config_path" names the architecture
    DIR/<cnn config>.json    {"encoder": {...}, "token_embedder": {...}, "dropout"}
    DIR/char.dic, word.dic   `token<TAB>id` lines
    DIR/token_embedder.pkl   torch state dicts (legacy pickles as released, or
    DIR/encoder.pkl          torch's zip format): `torch_pickle.py`

The architecture is bilm-tf's with three differences, which the options carry
(`char_cnn.spelling = "lexicon"`, `word_dim`, `n_words`): characters come
from a dictionary (`lexicon.py`), a word embedding is concatenated before the
highway output going into the projection, and the LSTM is AllenNLP's
`LstmCellWithProjection` (no forget bias added at run time). Its highway is
`g * x + (1 - g) * relu(A x)` with `g = sigmoid(B x)`: ours with the carry
gate `1 - g = sigmoid(-B x)`. The weights are renamed into elmo-jax's tree
here and nowhere else; from then on such a model is one like any other
(`embed`, `Elmo`, the Flax modules, fine-tuning, export with its lexicon).

The folder's config.json is told apart from a training workdir's by content:
ELMoForManyLangs' names "config_path".
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple

import numpy as np

from elmo_jax.errors import MissingFile
from elmo_jax.core.kernels import FORGET_BIAS
from elmo_jax.core.lexicon import Lexicon, LexiconError, from_manylangs, read_dic
from elmo_jax.core.options import CharCNNOptions, ElmoOptions, LSTMOptions, OptionsError
from elmo_jax.formats.torch_pickle import load_state_dict
from elmo_jax.formats.weights import WeightsError

# The architecture every released model uses; its config.json often points at
# the package's copy (`configs/cnn_50_100_512_4096_sample.json`) instead of
# carrying one, so a missing file falls back to it, as the package does.
RELEASED_CONFIG = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3,
                "dim": 4096, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu",
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512],
                                   [7, 1024]],
                       "n_highway": 2, "word_dim": 100, "char_dim": 50,
                       "max_characters_per_token": 50},
    "dropout": 0.1,
}
RELEASED_CONFIG_NAMES = ("cnn_50_100_512_4096_sample.json", "cnn_0_100_512_4096_sample.json")


class ManyLangsModel(NamedTuple):
    options: ElmoOptions
    params: dict        # elmo-jax's biLM tree (numpy float32)
    lexicon: Lexicon


def is_manylangs(path: str | os.PathLike) -> bool:
    """Whether `path` is an ELMoForManyLangs model folder (its config.json
    names "config_path", and the two pickles are there)."""
    path = os.fspath(path)
    config = os.path.join(path, "config.json")
    if not (os.path.isdir(path) and os.path.exists(config)
            and os.path.exists(os.path.join(path, "encoder.pkl"))):
        return False
    try:
        with open(config, encoding="utf-8") as fh:
            return "config_path" in json.load(fh)
    except (ValueError, TypeError, OSError):
        return False


def architecture(folder: str) -> dict:
    """The cnn config the folder's config.json names (found as the package
    finds it: the path, its file name in the folder, or the released one)."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
        name = json.load(fh)["config_path"]
    for candidate in (os.path.join(folder, name), os.path.join(folder, os.path.basename(name))):
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as fh:
                try:
                    return json.load(fh)
                except ValueError as e:
                    raise OptionsError(f"{candidate}: not valid JSON ({e})") from None
    if os.path.basename(name) in RELEASED_CONFIG_NAMES:
        return RELEASED_CONFIG
    raise MissingFile(f"{folder}: config.json names the architecture {name!r}, which is "
                            "neither there nor in the folder")


def options_for(config: dict, lexicon: Lexicon, where: str) -> ElmoOptions:
    enc, te = config.get("encoder", {}), config.get("token_embedder", {})
    if enc.get("name", "").lower() != "elmo" or te.get("name", "").lower() != "cnn":
        raise OptionsError(f"{where}: encoder {enc.get('name')!r} with token embedder "
                           f"{te.get('name')!r}: elmo-jax reads the 'elmo' encoder with the "
                           "'cnn' token embedder (every released model)")
    if not te.get("char_dim"):
        raise OptionsError(f"{where}: a model without characters (char_dim 0) has no "
                           "character CNN; elmo-jax cannot run it")
    if enc["dim"] == enc["projection_dim"]:
        raise OptionsError(f"{where}: dim == projection_dim: elmo-jax builds no projection "
                           "then, and this model has one")
    return ElmoOptions(
        lstm=LSTMOptions(dim=enc["dim"], projection_dim=enc["projection_dim"],
                         n_layers=enc["n_layers"], cell_clip=enc.get("cell_clip") or None,
                         proj_clip=enc.get("proj_clip") or None, use_skip_connections=True),
        char_cnn=CharCNNOptions(
            activation=te["activation"], embedding_dim=te["char_dim"],
            filters=tuple((int(w), int(n)) for w, n in te["filters"]),
            n_highway=te["n_highway"], n_characters=lexicon.n_characters,
            max_characters_per_token=te["max_characters_per_token"], spelling="lexicon",
            word_dim=te.get("word_dim") or 0, n_words=lexicon.n_words),
        dropout=float(config.get("dropout", 0.1)))


def _lexicon(folder: str):
    config = architecture(folder)
    te = config.get("token_embedder", {})
    chars = read_dic(os.path.join(folder, "char.dic"))
    words = read_dic(os.path.join(folder, "word.dic")) if te.get("word_dim") else None
    lexicon, char_rows, word_rows = from_manylangs(chars, words, folder)
    return options_for(config, lexicon, folder), lexicon, char_rows, word_rows


def read_manylangs(folder: str | os.PathLike) -> ManyLangsModel:
    """The model in an ELMoForManyLangs folder, as elmo-jax options, parameters
    and lexicon."""
    folder = os.fspath(folder)
    options, lexicon, char_rows, word_rows = _lexicon(folder)
    te_sd = load_state_dict(os.path.join(folder, "token_embedder.pkl"))
    enc_sd = load_state_dict(os.path.join(folder, "encoder.pkl"))
    try:
        params = _convert(te_sd, enc_sd, options, char_rows, word_rows)
    except KeyError as e:
        raise WeightsError(f"{folder}: the pickles have no {e.args[0]!r} that the config "
                           "calls for (do the pickles go with this config?)") from None
    _check_shapes(params, options, folder)
    return ManyLangsModel(options, params, lexicon)


def _rows(table: np.ndarray, rows: np.ndarray, what: str, where: str) -> np.ndarray:
    if rows.max() >= table.shape[0]:
        raise LexiconError(f"{where}: the {what} dictionary has id {int(rows.max())}, the "
                           f"table only {table.shape[0]} rows")
    out = table[np.maximum(rows, 0)].astype(np.float32)
    out[0] = 0.0  # the padding token
    return out


def _convert(te: dict, enc: dict, options: ElmoOptions, char_rows, word_rows) -> dict:
    c, F = options.char_cnn, options.char_cnn.n_filters
    where = "token_embedder.pkl"
    ce = {"char_embed": _rows(te["char_emb_layer.embedding.weight"], char_rows, "character",
                              where)}
    if c.word_dim:
        ce["word_embed"] = _rows(te["word_emb_layer.embedding.weight"], word_rows, "word",
                                 where)
    for i in range(len(c.filters)):  # Conv1d [out, in, width] -> [width, in, out]
        ce[f"conv_{i}"] = {"kernel": np.transpose(te[f"convolutions.{i}.weight"], (2, 1, 0)),
                           "bias": te[f"convolutions.{i}.bias"]}
    for k in range(c.n_highway):  # y = x W^T + b, W = [A; B]
        w, b = te[f"highways._layers.{k}.weight"], te[f"highways._layers.{k}.bias"]
        ce[f"highway_{k}"] = {"w_transform": w[:F].T, "b_transform": b[:F],
                              "w_carry": -w[F:].T, "b_carry": -b[F:]}
    ce["proj"] = {"kernel": te["projection.weight"].T, "bias": te["projection.bias"]}
    D = options.lstm.dim
    lstm = {}
    for layer in range(options.lstm.n_layers):
        cells = [f"{d}_layer_{layer}" for d in ("forward", "backward")]
        bias = np.stack([enc[f"{n}.state_linearity.bias"] for n in cells])
        bias[:, D:2 * D] -= FORGET_BIAS  # our cell adds it at run time; AllenNLP's does not
        lstm[f"layer_{layer}"] = {
            "w_in": np.stack([enc[f"{n}.input_linearity.weight"].T for n in cells]),
            "w_h": np.stack([enc[f"{n}.state_linearity.weight"].T for n in cells]),
            "b": bias,
            "w_proj": np.stack([enc[f"{n}.state_projection.weight"].T for n in cells])}
    tree = {"char_encoder": ce, "lstm": lstm}
    return _float32(tree)


def _float32(tree):
    if isinstance(tree, dict):
        return {k: _float32(v) for k, v in tree.items()}
    return np.ascontiguousarray(tree, np.float32)


def _check_shapes(params: dict, options: ElmoOptions, folder: str) -> None:
    """The converted tree against the one the options describe."""
    from elmo_jax.core.bilm import named_leaves, param_shapes

    shapes = param_shapes(options)
    for key, value in named_leaves(params).items():
        if shapes.get(key) != value.shape:
            raise WeightsError(f"{folder}: {key} has shape {value.shape}, the config calls for "
                               f"{shapes.get(key)} (do the pickles go with this config?)")
