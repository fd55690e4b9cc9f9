"""elmo-jax: ELMo (Peters et al. 2018) in JAX/Flax.

    import elmo_jax
    elmo = elmo_jax.Elmo.from_files("options.json", "weights.hdf5")
    vectors = elmo.embed_sentences([["Hello", "world", "."]])   # [3, 3, 1024] each

or, inside your own jitted code:

    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(sentences), options)

or as a Flax module (linen; `NnxElmoEmbedder` for NNX):

    elmo = elmo_jax.ElmoEmbedder.from_export("runs/x/export")   # mixes are its params
"""
from elmo_jax.chars import batch_to_char_ids
from elmo_jax.embedding import (Elmo, EmbedOutput, embed, embed_token_vectors, encode_tokens,
                                init_mix, scalar_mix)
from elmo_jax.export import load_export, save_export
from elmo_jax.model import LSTMState, init_params, init_state
from elmo_jax.modules import ElmoEmbedder, NnxElmoEmbedder
from elmo_jax.scoring import score_sentences
from elmo_jax.options import ElmoOptions, OptionsError
from elmo_jax.weights import WeightsError, load_weights, save_weights

__all__ = [
    "ElmoOptions", "OptionsError", "batch_to_char_ids", "load_weights", "save_weights",
    "WeightsError", "embed", "embed_token_vectors", "encode_tokens", "EmbedOutput", "init_state", "init_mix", "scalar_mix",
    "init_params", "LSTMState", "Elmo", "load_export", "save_export", "ElmoEmbedder",
    "NnxElmoEmbedder", "score_sentences",
]
__version__ = "0.1.0"
