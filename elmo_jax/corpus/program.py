"""The device program: character ids to the rows the store keeps, compiled
once per batch shape over a mesh of the local devices."""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax.corpus.settings import CorpusSettings
from elmo_jax.core.embedding import embed
from elmo_jax.core.embedding import mix_weights as normalized_mix
from elmo_jax.core.options import ElmoOptions
from elmo_jax.corpus.store import numpy_dtype


def corpus_program(params, char_ids, keep_lo, keep_hi, *, options: ElmoOptions,
                   settings: CorpusSettings):
    """Character ids [B, T, C] (int16) -> the stored rows of the batch, in one
    program: [B, T, *row_shape] in the stored dtype; with sentence vectors
    [B, *row_shape] float32, the sum over each row's kept tokens
    (keep_lo <= t < keep_hi; the host adds a line's windows and divides)."""
    dtype = jnp.bfloat16 if settings.compute_dtype == "bfloat16" else jnp.float32
    layers = embed(params, char_ids.astype(jnp.int32), options, dtype=dtype).layers  # [K,B,T,W]
    if settings.output == "mix":
        raw = jnp.asarray(settings.mix_weights, jnp.float32)[None]
        w = settings.gamma * normalized_mix({"weights": raw})[0]
        x = jnp.einsum("k,kbtw->btw", w, layers)
    elif settings.output == "layer":
        x = layers[settings.layer]
    else:
        x = jnp.transpose(layers, (1, 2, 0, 3))  # [B, T, K, W]: a token's rows together
    if settings.sentence_vectors:
        t = jnp.arange(x.shape[1])[None, :]
        keep = ((t >= keep_lo[:, None]) & (t < keep_hi[:, None])).astype(x.dtype)
        return jnp.einsum("bt,bt...->b...", keep, x)
    return x.astype(numpy_dtype(settings.dtype))


class Programs:
    """The corpus program compiled for every batch shape, over a mesh of the
    local devices (rows split over them, parameters replicated)."""

    def __init__(self, params, options, settings, devices, shapes):
        self.mesh = Mesh(np.array(devices), ("data",))
        self.rows = NamedSharding(self.mesh, P("data"))
        replicated = NamedSharding(self.mesh, P())
        self.params = jax.device_put(params, replicated)
        fn = jax.jit(functools.partial(corpus_program, options=options, settings=settings),
                     in_shardings=(replicated, self.rows, self.rows, self.rows),
                     out_shardings=self.rows)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.params)
        width = options.char_cnn.ids_per_token

        def compile_one(shape):
            rows, T = shape
            return fn.lower(abstract, jax.ShapeDtypeStruct((rows, T, width), jnp.int16),
                            jax.ShapeDtypeStruct((rows,), jnp.int32),
                            jax.ShapeDtypeStruct((rows,), jnp.int32)).compile()

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, min(len(shapes), os.cpu_count() or 1))) as pool:
            self.compiled = dict(zip(shapes, pool.map(compile_one, shapes)))

    def place(self, batch: dict) -> tuple:
        return tuple(jax.device_put(batch[k], self.rows)
                     for k in ("char_ids", "keep_lo", "keep_hi"))

    def __call__(self, shape, placed):
        return self.compiled[shape](self.params, *placed)
