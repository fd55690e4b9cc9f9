"""Embeddings of a text to an hdf5 file, in bilm-tf's `dump_bilm_embeddings`
layout: all layers, one layer, or a scalar mix per sentence."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from elmo_jax.api.elmo import Elmo
from elmo_jax.core.embedding import mix_weights as normalized
from elmo_jax.storage.paths import atomic_path


def dump_embeddings(elmo: Elmo, sentences: Sequence[Sequence[str]], path: str | os.PathLike,
                    batch_size: int = 64, layer: int | None = None,
                    mix_weights: Sequence[float] | None = None, gamma: float = 1.0,
                    chunk: int = 4096, progress: bool = False,
                    sentence_vectors: bool = False) -> int:
    """Write an hdf5 file in bilm-tf's `dump_bilm_embeddings` layout: dataset
    str(i) for sentence i, float32 [L+1, n_i, 2P]; with `layer`, that layer
    [n_i, 2P]; with `mix_weights` (raw scalars, softmax-normalised as in the
    scalar mix), gamma * the weighted sum [n_i, 2P]. The file appears whole or
    not at all. With `sentence_vectors`, each dataset is the mean over the
    sentence's tokens of what it would hold ([L+1, 2P] or [2P]; zeros for an
    empty sentence). Returns the number of sentences."""
    import h5py
    from tqdm import tqdm

    K = elmo.options.n_output_layers
    if layer is not None and not 0 <= layer < K:
        raise ValueError(f"--layer must be in 0..{K - 1}, got {layer}")
    if mix_weights is not None:
        if len(mix_weights) != K:
            raise ValueError(f"the mix needs {K} weights (one per layer), got {len(mix_weights)}")
        w = gamma * np.asarray(normalized({"weights": np.asarray([mix_weights], np.float32)})[0])
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as fh, \
            tqdm(total=len(sentences), disable=not progress, unit="sent") as bar:
        for start in range(0, len(sentences), chunk):
            part = sentences[start:start + chunk]
            for i, arr in enumerate(elmo.embed_sentences(part, batch_size=batch_size)):
                if layer is not None:
                    arr = arr[layer]
                elif mix_weights is not None:
                    arr = np.einsum("k,knd->nd", w, arr)
                if sentence_vectors:
                    tokens = arr.shape[-2]
                    arr = arr.sum(axis=-2) / max(tokens, 1)
                fh.create_dataset(str(start + i), data=arr.astype(np.float32))
            bar.update(len(part))
    return len(sentences)
