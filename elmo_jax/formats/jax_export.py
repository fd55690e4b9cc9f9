"""The `jax.export` artifact: the biLM as a serialized JAX program, for JAX
serving without elmo-jax (docs/formats/serving.md).

    DIR/embed.jaxexport   `jax.export.Exported.serialize()` of
                          (weights, char_ids [b, t, C] int32) -> (layers [L+1, b, t, 2P], mask [b, t])
                          with b and t symbolic (>= 1), lowered for cpu, cuda and tpu
    DIR/weights.npz       the weights, one flat dict keyed by each parameter's
                          `/`-joined path ("char_encoder/char_embed", ...)

A process with only jax and numpy installed runs it:

    exported = jax.export.deserialize(open("DIR/embed.jaxexport", "rb").read())
    layers, mask = exported.call(dict(np.load("DIR/weights.npz")), char_ids)

`char_ids` are bilm-tf's character ids (`batch_to_char_ids`, or the lexicon's
for an ELMoForManyLangs model), C ids a token. JAX reads a serialized program
for six months after the release that wrote it (its compatibility window):
past that, export again.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core.bilm import named_leaves
from elmo_jax.core.embedding import embed
from elmo_jax.core.options import ElmoOptions

PROGRAM_FILE = "embed.jaxexport"
WEIGHTS_NPZ = "weights.npz"
PLATFORMS = ("cpu", "cuda", "tpu")  # one artifact for every accelerator JAX serves on


def flat_weights(params: dict) -> dict[str, np.ndarray]:
    """The biLM's parameters as one flat dict (weights.npz's keys).

    Args:
        params: the biLM's parameter tree.

    Returns:
        {"char_encoder/char_embed": array, ...}: each parameter by its
        `/`-joined path, as a float32 numpy array.
    """
    return {name: np.asarray(v, np.float32) for name, v in named_leaves(params).items()}


def nested_weights(flat: dict) -> dict:
    """The inverse of `flat_weights` (the leaves as given: arrays or tracers)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, name = key.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = value
    return out


def layers_function(options: ElmoOptions):
    """f(weights, char_ids) -> (layers [L+1, B, T, 2P] float32, mask [B, T] bool):
    `embed` of a flat weights dict, stateless, float32."""
    options = options.network()

    def layers_and_mask(weights: dict, char_ids: jax.Array):
        out = embed(nested_weights(weights), char_ids, options)
        return out.layers, out.mask

    return layers_and_mask


def export_program(params: dict, options: ElmoOptions,
                   platforms: tuple[str, ...] = PLATFORMS) -> jax.export.Exported:
    """`layers_function` exported for `platforms`, batch and length symbolic.

    Args:
        params: the biLM's parameters (only their shapes are used).
        options: the model's `ElmoOptions`.
        platforms: the platforms to lower for.

    Returns:
        A `jax.export.Exported` taking (flat weights, char_ids [b, t, C] int32).
    """
    weights = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32)
               for k, v in flat_weights(params).items()}
    b, t = jax.export.symbolic_shape("b, t")
    char_ids = jax.ShapeDtypeStruct((b, t, options.char_cnn.ids_per_token), jnp.int32)
    return jax.export.export(jax.jit(layers_function(options)), platforms=platforms)(
        weights, char_ids)


def write_jax_export(folder: str, params: dict, options: ElmoOptions) -> None:
    """Write embed.jaxexport and weights.npz into the local `folder`."""
    program = export_program(params, options)
    with open(os.path.join(folder, PROGRAM_FILE), "wb") as fh:
        fh.write(program.serialize())
    np.savez(os.path.join(folder, WEIGHTS_NPZ), **flat_weights(params))
