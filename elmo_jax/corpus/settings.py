"""The corpus job's settings (the `embed` command's flags), checked against
the model, and the store specification they make with the model and inputs."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

import jax
import numpy as np

from elmo_jax.storage import paths
from elmo_jax.core.options import ElmoOptions
from elmo_jax.corpus.store import StoreError, StoreSpec, numpy_dtype

OUTPUTS = ("layers", "layer", "mix")


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """How a corpus is embedded and stored (the `embed` command's flags).

    Attributes:
        output: what a token's row holds: "layers" (all, [L+1, 2P]),
            "layer" (one, [2P]) or "mix" ([2P]).
        layer: the layer of output="layer".
        mix_weights: the L+1 raw scalars of output="mix" (softmax-normalised).
        gamma: the mix's scale.
        sentence_vectors: store each line's mean over its tokens instead.
        dtype: the stored dtype: float32, float16 or bfloat16.
        compute_dtype: the matmuls' input dtype (bfloat16 on accelerators).
        batch_tokens: rows x length of every batch shape.
        max_rows: at most this many rows a batch.
        max_length: longer lines go in overlapping windows of this many tokens.
        chunk_lines: lines a chunk (the unit of resuming).
        tokenize: None (tokens split by spaces), "en" or "zh".
        on_bad_line: a line that is not UTF-8: "error" or "skip" (stored
            empty, and counted).
    """
    output: str = "layers"
    layer: int | None = None
    mix_weights: tuple | None = None
    gamma: float = 1.0
    sentence_vectors: bool = False
    dtype: str = "float32"
    compute_dtype: str = "float32"
    batch_tokens: int = 4096
    max_rows: int | None = None
    max_length: int = 512
    chunk_lines: int = 4096
    tokenize: str | None = None
    on_bad_line: str = "error"

    def check(self, options: ElmoOptions) -> None:
        K = options.n_output_layers
        if self.output not in OUTPUTS:
            raise StoreError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if self.output == "layer" and not (self.layer is not None and 0 <= self.layer < K):
            raise StoreError(f"--layer must be in 0..{K - 1}, got {self.layer}")
        if self.output == "mix" and (self.mix_weights is None or len(self.mix_weights) != K):
            raise StoreError(f"the mix needs {K} weights (one per layer), got "
                             f"{0 if self.mix_weights is None else len(self.mix_weights)}")
        numpy_dtype(self.dtype)
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise StoreError(f"compute_dtype must be float32 or bfloat16, got "
                             f"{self.compute_dtype!r}")
        for name in ("batch_tokens", "chunk_lines"):
            if getattr(self, name) < 1:
                raise StoreError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 8:
            raise StoreError(f"--max_length must be >= 8, got {self.max_length}")
        if self.on_bad_line not in ("error", "skip"):
            raise StoreError(f"--on_bad_line must be error or skip, got {self.on_bad_line!r}")

    def row_shape(self, options: ElmoOptions) -> tuple:
        W = options.output_dim
        return (options.n_output_layers, W) if self.output == "layers" else (W,)


def model_fingerprint(params: dict, options: ElmoOptions) -> str:
    """A digest of the options and every parameter's name, shape and bytes."""
    h = hashlib.sha256(json.dumps(options.to_dict(), sort_keys=True).encode())
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(params)[0],
                             key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def describe_inputs(files: Sequence[str]) -> list[dict]:
    out = []
    for f in files:
        if paths.is_remote(f):  # an object: its size and generation (or ETag)
            size, version = paths.version(f)
            out.append({"path": f, "size": size, "version": version})
            continue
        st = os.stat(f)
        out.append({"path": os.path.abspath(f), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def store_spec(params: dict, options: ElmoOptions, files: Sequence[str],
               settings: CorpusSettings, num_shards: int) -> StoreSpec:
    """What the store of this job holds and how it is made (`store.StoreSpec`):
    every worker writes the same, and a rerun must match it."""
    return StoreSpec(model=model_fingerprint(params, options), options=options.to_dict(),
                     output=settings.output, layer=settings.layer,
                     mix_weights=None if settings.mix_weights is None
                     else list(settings.mix_weights),
                     gamma=settings.gamma, sentence_vectors=settings.sentence_vectors,
                     dtype=settings.dtype, row_shape=list(settings.row_shape(options)),
                     inputs=describe_inputs(files), chunk_lines=settings.chunk_lines,
                     num_shards=num_shards, max_length=settings.max_length,
                     tokenize=settings.tokenize, on_bad_line=settings.on_bad_line)
