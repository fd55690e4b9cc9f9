"""bilm-tf's hdf5 weight format, both ways.

This is the only module that knows TensorFlow's dataset names, its gate order
(i, j, f, o) and its matrix layout ([input; h_prev] stacked in `W_0`):

    char_embed                                  [n_characters - 1, E]  (no padding row)
    CNN/W_cnn_{i}, CNN/b_cnn_{i}                [1, width, E, n], [n]
    CNN_high_{k}/W_carry, W_transform           [F, F]
    CNN_high_{k}/b_carry, b_transform           [F]
    CNN_proj/W_proj, CNN_proj/b_proj            [F, P], [P]  ([W + F, P] with a word table)
    word_embed                                  [n_words - 1, W]  (a lexicon model's only,
                                                 `lexicon.py`; read before the highway output)
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0    [P_in + P, 4D]
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/B      [4D]  (forget bias +1 not stored)
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_P_0  [D, P]  (none when D == P: no projection)

d is 0 for the forward and 1 for the backward direction. All matrices are
`x @ W`. The softmax is not part of the format (bilm-tf's `dump_weights` leaves
it out); `save_softmax` / `load_softmax` keep it in a file of its own, with the
names of bilm-tf's checkpoint:

    softmax/W  [V, P]   (logits = h @ W.T + b)
    softmax/b  [V]

Loading then saving reproduces every dataset bit for bit.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import h5py
import numpy as np

from elmo_jax.errors import MissingFile, UserError
from elmo_jax.storage.paths import atomic_path
from elmo_jax.core.options import ElmoOptions

# TF's column blocks (i, j, f, o) <-> ours (i, f, g, o): a swap, its own inverse.
_GATE_PERM = (0, 2, 1, 3)


class WeightsError(UserError, ValueError):
    """A weight file that does not match its options; names the dataset."""


def _lstm_name(direction: int, layer: int, leaf: str) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/{leaf}"


def expected_shapes(options: ElmoOptions) -> dict[str, tuple[int, ...]]:
    """Dataset name -> shape, for a file that matches `options`."""
    c, lo = options.char_cnn, options.lstm
    E, F, P, D = c.embedding_dim, c.n_filters, lo.projection_dim, lo.dim
    shapes = {"char_embed": (c.table_rows - 1, E)}  # row 0, the padding token, not stored
    if c.word_dim:
        shapes["word_embed"] = (c.n_words - 1, c.word_dim)
    for i, (width, num) in enumerate(c.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, E, num)
        shapes[f"CNN/b_cnn_{i}"] = (num,)
    for k in range(c.n_highway):
        for w in ("W_carry", "W_transform"):
            shapes[f"CNN_high_{k}/{w}"] = (F, F)
        for b in ("b_carry", "b_transform"):
            shapes[f"CNN_high_{k}/{b}"] = (F,)
    shapes["CNN_proj/W_proj"] = (c.word_dim + F, P)
    shapes["CNN_proj/b_proj"] = (P,)
    for d in range(2):
        for layer in range(lo.n_layers):
            shapes[_lstm_name(d, layer, "W_0")] = (P + P, 4 * D)
            shapes[_lstm_name(d, layer, "B")] = (4 * D,)
            if D != P:  # bilm-tf makes no projection (and no W_P_0) when D == P
                shapes[_lstm_name(d, layer, "W_P_0")] = (D, P)
    return shapes


def _permute_gates(x: np.ndarray) -> np.ndarray:
    """Reorder the last axis' four gate blocks between TF's and our order."""
    blocks = np.split(x, 4, axis=-1)
    return np.concatenate([blocks[i] for i in _GATE_PERM], axis=-1)


def params_to_datasets(params: dict, options: ElmoOptions) -> dict[str, np.ndarray]:
    """Our parameter tree -> {dataset name: float32 array} in bilm-tf's layout."""
    p = _to_numpy(params)
    enc, P = p["char_encoder"], options.lstm.projection_dim
    out = {"char_embed": enc["char_embed"][1:]}
    if "word_embed" in enc:
        out["word_embed"] = enc["word_embed"][1:]
    for i in range(len(options.char_cnn.filters)):
        out[f"CNN/W_cnn_{i}"] = enc[f"conv_{i}"]["kernel"][None]
        out[f"CNN/b_cnn_{i}"] = enc[f"conv_{i}"]["bias"]
    for k in range(options.char_cnn.n_highway):
        h = enc[f"highway_{k}"]
        out[f"CNN_high_{k}/W_carry"] = h["w_carry"]
        out[f"CNN_high_{k}/W_transform"] = h["w_transform"]
        out[f"CNN_high_{k}/b_carry"] = h["b_carry"]
        out[f"CNN_high_{k}/b_transform"] = h["b_transform"]
    out["CNN_proj/W_proj"] = enc["proj"]["kernel"]
    out["CNN_proj/b_proj"] = enc["proj"]["bias"]
    for layer in range(options.lstm.n_layers):
        lp = p["lstm"][f"layer_{layer}"]
        if lp["w_in"].shape[1] != P:
            raise WeightsError(f"lstm layer {layer} has input width {lp['w_in'].shape[1]}, "
                               f"expected {P}")
        for d in range(2):
            w0 = np.concatenate([lp["w_in"][d], lp["w_h"][d]], axis=0)
            out[_lstm_name(d, layer, "W_0")] = _permute_gates(w0)
            out[_lstm_name(d, layer, "B")] = _permute_gates(lp["b"][d])
            if "w_proj" in lp:
                out[_lstm_name(d, layer, "W_P_0")] = lp["w_proj"][d]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def datasets_to_params(ds: dict[str, np.ndarray], options: ElmoOptions) -> dict:
    """{dataset name: array} in bilm-tf's layout -> our parameter tree (numpy)."""
    c, P = options.char_cnn, options.lstm.projection_dim
    table = ds["char_embed"]
    enc = {"char_embed": np.concatenate([np.zeros((1, table.shape[1]), np.float32), table])}
    if c.word_dim:
        words = ds["word_embed"]
        enc["word_embed"] = np.concatenate([np.zeros((1, words.shape[1]), np.float32), words])
    for i in range(len(c.filters)):
        enc[f"conv_{i}"] = {"kernel": ds[f"CNN/W_cnn_{i}"][0], "bias": ds[f"CNN/b_cnn_{i}"]}
    for k in range(c.n_highway):
        enc[f"highway_{k}"] = {
            "w_carry": ds[f"CNN_high_{k}/W_carry"], "b_carry": ds[f"CNN_high_{k}/b_carry"],
            "w_transform": ds[f"CNN_high_{k}/W_transform"],
            "b_transform": ds[f"CNN_high_{k}/b_transform"]}
    enc["proj"] = {"kernel": ds["CNN_proj/W_proj"], "bias": ds["CNN_proj/b_proj"]}
    lstm = {}
    for layer in range(options.lstm.n_layers):
        w0 = [_permute_gates(ds[_lstm_name(d, layer, "W_0")]) for d in range(2)]
        lstm[f"layer_{layer}"] = {
            "w_in": np.stack([w[:P] for w in w0]),
            "w_h": np.stack([w[P:] for w in w0]),
            "b": np.stack([_permute_gates(ds[_lstm_name(d, layer, "B")]) for d in range(2)]),
        }
        if options.lstm.dim != P:
            lstm[f"layer_{layer}"]["w_proj"] = np.stack(
                [ds[_lstm_name(d, layer, "W_P_0")] for d in range(2)])
    return {"char_encoder": enc, "lstm": lstm}


def read_datasets(path: str | os.PathLike, options: ElmoOptions) -> dict[str, np.ndarray]:
    """Read and check every dataset that `options` calls for: present, of the
    expected shape, floating point, readable to the end (a truncated file names
    the dataset it breaks in); NaN or inf values are warned about by name."""
    shapes = expected_shapes(options)
    path = os.fspath(path)
    out = {}
    with _open(path, "weight file") as fh:
        # bilm-tf leaves CNN_proj out when n_filters == projection_dim; an
        # identity projection is the same function.
        if ("CNN_proj" not in fh and options.char_cnn.n_filters == options.lstm.projection_dim
                and not options.char_cnn.word_dim):
            F = options.char_cnn.n_filters
            out["CNN_proj/W_proj"] = np.eye(F, dtype=np.float32)
            out["CNN_proj/b_proj"] = np.zeros(F, np.float32)
        for name, shape in shapes.items():
            if name not in out:
                out[name] = _read_dataset(fh, path, name, shape)
    return out


def _open(path: str, what: str) -> h5py.File:
    if not os.path.exists(path):
        raise MissingFile(f"{what} not found: {path}")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise WeightsError(f"{path}: not a readable hdf5 file, or truncated ({e})") from None


def _read_dataset(fh, path: str, name: str, shape: tuple) -> np.ndarray:
    hint = "(is this the weight file that goes with these options?)"
    try:
        ds = fh[name] if name in fh else None
    except (OSError, KeyError, RuntimeError) as e:
        raise WeightsError(f"{path}: dataset '{name}' cannot be opened ({e}): the file is "
                           "damaged or truncated") from None
    if not isinstance(ds, h5py.Dataset):
        raise WeightsError(f"{path}: dataset '{name}' is missing; the options call for shape "
                           f"{shape} {hint}")
    if ds.shape != shape:
        raise WeightsError(f"{path}: dataset '{name}' has shape {ds.shape}, expected {shape} "
                           f"from the options {hint}")
    if ds.dtype.kind != "f":
        raise WeightsError(f"{path}: dataset '{name}' holds {ds.dtype}, not floating-point "
                           "weights")
    try:
        value = np.asarray(ds[...], dtype=np.float32)
    except (OSError, RuntimeError, ValueError) as e:
        raise WeightsError(f"{path}: dataset '{name}' cannot be read ({e}): the file is "
                           "damaged or truncated") from None
    bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
    if bad:
        warnings.warn(f"{path}: dataset '{name}' holds {bad} NaN or infinite value(s); "
                      "the model's outputs will not be finite", stacklevel=4)
    return value


def load_weights(path: str | os.PathLike, options: ElmoOptions) -> dict:
    """Read a bilm-tf hdf5 weights file (bilm-tf's dataset names).

    Args:
        path: the hdf5 file (local, in a bucket).
        options: the model's `ElmoOptions` (or the path of its options.json);
            every dataset's shape is checked against them.

    Returns:
        The biLM parameter tree (numpy float32 arrays), `embed`'s `params`.

    Raises:
        WeightsError: a missing, damaged or truncated file, a missing dataset
            or one whose shape does not match the options (named).
    """
    if isinstance(options, (str, os.PathLike)):  # the options file, as AllenNLP's Elmo takes it
        options = ElmoOptions.from_json(options)
    return datasets_to_params(read_datasets(path, options), options)


def save_weights(path: str | os.PathLike, params: dict, options: ElmoOptions) -> None:
    """Write biLM parameters as a bilm-tf hdf5 file (AllenNLP reads it).

    The file appears whole or not at all: it is written beside `path` and
    renamed into place.

    Args:
        path: the file to write (local or in a bucket).
        params: a parameter tree as from `load_weights`, `init_params` or
            training (an extra "softmax" entry is ignored).
        options: the model's `ElmoOptions`.

    Raises:
        WeightsError: a parameter whose shape does not match the options.
    """
    ds = params_to_datasets(params, options)
    for name, shape in expected_shapes(options).items():
        if ds[name].shape != shape:
            raise WeightsError(f"parameter for '{name}' has shape {ds[name].shape}, "
                               f"expected {shape} from the options")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as fh:
        for name, arr in ds.items():
            fh.create_dataset(name, data=arr)


def _to_numpy(tree):
    if isinstance(tree, Mapping):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)


def save_softmax(path: str | os.PathLike, softmax: dict) -> None:
    """Write the word softmax ({"w": [V, P], "b": [V]}) in its own hdf5 file."""
    w, b = np.asarray(softmax["w"], np.float32), np.asarray(softmax["b"], np.float32)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as fh:
        fh.create_dataset("softmax/W", data=w)
        fh.create_dataset("softmax/b", data=b)


def load_softmax(path: str | os.PathLike, options: ElmoOptions,
                 vocab_size: int | None = None) -> dict:
    """The word softmax {"w": [V, P], "b": [V]}, checked against the options'
    projection width and, when given, the vocabulary size."""
    path = os.fspath(path)
    with _open(path, "softmax file") as fh:
        V = vocab_size if vocab_size is not None else (
            fh["softmax/W"].shape[0] if "softmax/W" in fh else 0)
        P = options.lstm.projection_dim
        return {"w": _read_dataset(fh, path, "softmax/W", (V, P)),
                "b": _read_dataset(fh, path, "softmax/b", (V,))}
