"""ELMo as a Flax module, the way AllenNLP's `Elmo` sits in a PyTorch model:
character ids in, `n_mixes` learned scalar mixes of the biLM layers (and the
mask) out. The mixes (and their optional layer norm) are the module's
parameters; the biLM weights live in a collection of their own and receive no
gradient unless `fine_tune=True`.

Linen:

    embedder = ElmoEmbedder.from_pretrained("original", n_mixes=1)  # or a path, a URL
    variables = embedder.init(rng, char_ids)       # the weights opened once, above
    (mixed,), mask = embedder.apply(variables, char_ids)       # [B, T, 2P], [B, T]

`variables["params"]` holds the mix; `variables["bilm"]["weights"]` the biLM
(in `"params"` with `fine_tune=True`). `init_variables` builds them from
weights already in memory. NNX: `NnxElmoEmbedder(options, bilm_params, rngs=...)`;
a frozen biLM is a `BiLMWeights` variable, not an `nnx.Param`, so `nnx.grad`
and `nnx.Optimizer(..., wrt=nnx.Param)` leave it alone.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import unfreeze

from elmo_jax.core.chars import batch_to_char_ids
from elmo_jax.core.embedding import check_options, embed
from elmo_jax.core.bilm import init_params
from elmo_jax.core.options import ElmoOptions


class ElmoOutput(NamedTuple):
    """What the modules return (a pytree; unpacks as `(mixed,), mask`).

    Attributes:
        mixed: one [B, T, 2P] array per scalar mix (dropout applied when
            training).
        mask: [B, T] bool, True at real tokens.
    """
    mixed: tuple
    mask: jax.Array


def _load(module: "ElmoEmbedder", rng) -> dict:
    """The biLM weights `init` starts from: those given (opened once, before),
    else random ones (said, unless `random_bilm`); the deprecated
    `weights_file` is read here. Plain dicts (linen freezes a module's dict
    attributes)."""
    if module.weights is not None:
        return jax.tree.map(jnp.asarray, unfreeze(module.weights))
    if module.weights_file is None:
        if not module.random_bilm:
            warnings.warn("ElmoEmbedder has no weights: its biLM is random. Open a model "
                          "(ElmoEmbedder.from_pretrained(path), or weights=open_model(path)"
                          ".params), or pass random_bilm=True if that is meant", stacklevel=4)
        return init_params(module.options, rng)
    warnings.warn("ElmoEmbedder(weights_file=...) reads the file inside init; open the model "
                  "once instead: ElmoEmbedder.from_pretrained(path) or "
                  "ElmoEmbedder(options, weights=open_model(path).params)",
                  DeprecationWarning, stacklevel=3)
    from elmo_jax.formats.stored_model import open_model  # orbax is imported only when a model is opened

    return jax.tree.map(jnp.asarray, open_model(module.weights_file).params)


class ElmoEmbedder(nn.Module):
    """ELMo as a linen module: char ids [B, T, C] -> (a tuple of `n_mixes`
    [B, T, 2P] mixes, the mask [B, T]).

    Attributes:
        options: the biLM's `ElmoOptions`.
        weights: the biLM's parameters, opened once (`open_model(...).params`;
            `from_pretrained` does it), the start of the "bilm" variables at
            `init`; None: random biLM weights (`init_params`). A module holding
            them is not hashable: give it to `jax.jit` in a closure, not as a
            static argument.
        weights_file: deprecated: a stored model read inside `init`.
        n_mixes: how many scalar mixes (AllenNLP's num_output_representations).
        layer_norm: AllenNLP's do_layer_norm.
        dropout: on each mix, as AllenNLP's Elmo (0.5 there); needs a "dropout"
            rng when not deterministic.
        fine_tune: the biLM weights are parameters ("params"/"bilm") and train.
        dtype: the matmul dtype of the biLM (bfloat16 on accelerators).
        lexicon: the dictionaries of a model that spells tokens with them
            (ELMoForManyLangs'); `char_ids` uses them.
        random_bilm: without weights, a random biLM is meant (no warning).

    Called as `embedder.apply(variables, char_ids, deterministic=True)`:
    deterministic (no dropout) unless `deterministic=False`, as
    `NnxElmoEmbedder` is until `.train()`. Returns an `ElmoOutput`.
    """
    options: ElmoOptions
    weights: Any = None
    weights_file: str | None = None
    n_mixes: int = 1
    layer_norm: bool = False
    dropout: float = 0.5
    fine_tune: bool = False
    dtype: Any = jnp.float32
    lexicon: Any = None
    random_bilm: bool = False

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, **kwargs) -> "ElmoEmbedder":
        """The module over a published or stored model, opened once, here
        (`init` then reads no file).

        Args:
            model: a registry name, a URL or a stored model (`open_model`: an
                export folder, a weights file with options.json beside it, a
                training workdir, an ELMoForManyLangs folder).
            **kwargs: the module's other attributes (`n_mixes`, `fine_tune`, ...).

        Returns:
            An `ElmoEmbedder` whose `weights` are the model's parameters.
        """
        from elmo_jax.formats.stored_model import open_model

        stored = open_model(model)  # opened once, here: init reads no file
        return cls(stored.options, weights=stored.params, lexicon=stored.lexicon, **kwargs)

    def char_ids(self, sentences: Sequence[Sequence[str]], min_length: int = 0):
        """The module's input for token lists (UTF-8 ids, or the lexicon's).

        Args:
            sentences: B token lists.
            min_length: the fewest token positions T.

        Returns:
            [B, T, ids per token] int32 numpy ids.
        """
        return _char_ids(self.options, self.lexicon, sentences, min_length)

    @nn.compact
    def __call__(self, char_ids, deterministic: bool = True) -> ElmoOutput:
        check_options(self.options, "ElmoEmbedder")
        if self.fine_tune:
            bilm = self.param("bilm", lambda rng: _load(self, rng))
        else:
            bilm = jax.lax.stop_gradient(self.variable(
                "bilm", "weights",
                lambda: _load(self, self.make_rng("params") if self.weights is None
                              and self.weights_file is None else None)
            ).value)
        K = self.options.n_output_layers
        mix = {"weights": self.param("scalar_mix_weights", nn.initializers.zeros,
                                     (self.n_mixes, K)),
               "gamma": self.param("gamma", nn.initializers.ones, (self.n_mixes,))}
        out = embed(bilm, char_ids, self.options, mix=mix, mix_layer_norm=self.layer_norm,
                    dtype=self.dtype)
        drop = nn.Dropout(self.dropout)
        return ElmoOutput(tuple(drop(m, deterministic=deterministic) for m in out.mixed),
                          out.mask)


def _char_ids(options: ElmoOptions, lexicon, sentences, min_length: int):
    C = options.char_cnn.max_characters_per_token
    if lexicon is not None:
        return lexicon.batch_ids(sentences, C, min_length)
    return batch_to_char_ids(sentences, C, min_length)


def init_variables(module: ElmoEmbedder, rng: jax.Array, char_ids, bilm_params: dict) -> dict:
    """`module.init` with biLM weights already in memory (no file read, no
    random biLM).

    Args:
        module: an `ElmoEmbedder`.
        rng: a `jax.random` key for the mix's parameters.
        char_ids: [B, T, C] int32 example input.
        bilm_params: the biLM's parameters.

    Returns:
        The variables: {"params": the mix [+ "bilm" when fine-tuning],
        "bilm": {"weights": ...} when frozen}.
    """
    bilm = jax.tree.map(jnp.asarray, bilm_params)
    given = {"params": {"bilm": bilm}} if module.fine_tune else {"bilm": {"weights": bilm}}
    _, variables = module.apply(given, char_ids, mutable=True, rngs={"params": rng})
    return dict(variables)  # every collection, the given biLM included


class BiLMWeights(nnx.Variable):
    """The biLM's weights when frozen: not an nnx.Param, so gradients and
    optimizers over parameters (`nnx.Optimizer(..., wrt=nnx.Param)`) leave
    them alone; `nnx.state(model, BiLMWeights)` selects them.

    Args:
        value: one parameter array of the biLM.
        hijax: as `nnx.Variable`'s.
        ref: as `nnx.Variable`'s.
        eager_sharding: as `nnx.Variable`'s (and any metadata).
    """


class NnxElmoEmbedder(nnx.Module):
    """ElmoEmbedder in NNX: `NnxElmoEmbedder(options, bilm_params, rngs=nnx.Rngs(0))`,
    called as `embedder(char_ids)` -> an `ElmoOutput` (a tuple of n_mixes
    [B, T, 2P] mixes, the mask [B, T]). Deterministic (no dropout), as the
    linen module, until `model.train()` (or `deterministic=False` in the
    call); `model.eval()` turns the dropout off again.

    Args:
        options: the biLM's `ElmoOptions`.
        bilm_params: the biLM's parameters (`open_model(...).params`).
        n_mixes: how many scalar mixes.
        layer_norm: AllenNLP's do_layer_norm.
        dropout: on each mix.
        fine_tune: the biLM weights are `nnx.Param` and train; else they
            are `BiLMWeights`, which optimizers over parameters leave alone.
        dtype: the matmul dtype of the biLM.
        lexicon: the dictionaries of a model that spells tokens with them.
        rngs: the `nnx.Rngs` for the dropout.
    """

    def __init__(self, options: ElmoOptions, bilm_params: dict, *, n_mixes: int = 1,
                 layer_norm: bool = False, dropout: float = 0.5, fine_tune: bool = False,
                 dtype=jnp.float32, lexicon=None, rngs: nnx.Rngs):
        options = check_options(options, "NnxElmoEmbedder")
        kind = nnx.Param if fine_tune else BiLMWeights
        self.bilm = nnx.data(jax.tree.map(lambda x: kind(jnp.asarray(x)), bilm_params))
        K = options.n_output_layers
        self.scalar_mix_weights = nnx.Param(jnp.zeros((n_mixes, K), jnp.float32))
        self.gamma = nnx.Param(jnp.ones((n_mixes,), jnp.float32))
        self.dropout = nnx.Dropout(dropout, deterministic=True, rngs=rngs)  # until .train()
        self.options, self.layer_norm, self.fine_tune, self.dtype = (options, layer_norm,
                                                                     fine_tune, dtype)
        self.lexicon = lexicon

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, *, rngs: nnx.Rngs, **kwargs):
        """The module over a published or stored model.

        Args:
            model: a registry name, a URL or a stored model (`open_model`).
            rngs: the `nnx.Rngs` for the dropout.
            **kwargs: the constructor's other arguments (`n_mixes`, ...).

        Returns:
            An `NnxElmoEmbedder`.
        """
        from elmo_jax.formats.stored_model import open_model

        stored = open_model(model)
        return cls(stored.options, stored.params, lexicon=stored.lexicon, rngs=rngs, **kwargs)

    def char_ids(self, sentences: Sequence[Sequence[str]], min_length: int = 0):
        """The module's input for token lists (UTF-8 ids, or the lexicon's).

        Args:
            sentences: B token lists.
            min_length: the fewest token positions T.

        Returns:
            [B, T, ids per token] int32 numpy ids.
        """
        return _char_ids(self.options, self.lexicon, sentences, min_length)

    def __call__(self, char_ids, deterministic: bool | None = None) -> ElmoOutput:
        bilm = jax.tree.map(lambda v: v[...], self.bilm,
                            is_leaf=lambda v: isinstance(v, nnx.Variable))
        if not self.fine_tune:
            bilm = jax.lax.stop_gradient(bilm)
        mix = {"weights": self.scalar_mix_weights[...], "gamma": self.gamma[...]}
        out = embed(bilm, char_ids, self.options, mix=mix, mix_layer_norm=self.layer_norm,
                    dtype=self.dtype)
        return ElmoOutput(tuple(self.dropout(m, deterministic=deterministic) for m in out.mixed),
                          out.mask)
