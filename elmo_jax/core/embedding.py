"""`embed`: character ids -> the ELMo layer stack, plus the learned scalar mix.

`embed` is a pure function of (params, char_ids[, state][, mix]); the options
are static. It runs a program jitted with the options' network and
`mix_layer_norm` static (one program for every options file of one network),
and works under `jax.grad`, `jax.vmap` and a sharded `jax.jit` (no Python
control flow on data). The notebook wrapper is `elmo.Elmo`; the hdf5 dump `dump.py`.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core.bilm import (BiLM, LSTMState, init_state, named_leaves, param_shapes,
                                token_mask)
from elmo_jax.core.options import ElmoOptions
from elmo_jax.errors import UserError


class _EmbedFields(NamedTuple):
    layers: jax.Array
    mask: jax.Array
    state: LSTMState
    mixed: tuple | None = None
    mix_weights: jax.Array | None = None


class EmbedOutput(_EmbedFields):
    """What `embed` returns (a pytree).

    Attributes:
        layers: [L+1, B, T, 2P] float32. Layer 0 is the token vectors
            duplicated, then one per LSTM layer (forward half, backward half);
            zero at padded tokens.
        mask: [B, T] bool, True at real tokens.
        state: the LSTMState after the last real position of each row.
        mixed: one [B, T, 2P] array per scalar mix; reading it from a call
            without `mix` is an `ArgumentError` that says to pass one.
        mix_weights: [n_mixes, L+1] softmax-normalised mix weights, or None
            without `mix`.
    """
    __slots__ = ()

    @property
    def mixed(self) -> tuple:
        value = tuple.__getitem__(self, 3)
        if value is None:
            raise ArgumentError("EmbedOutput.mixed: embed was called without a mix; pass "
                                "mix=init_mix(options) (the layers are in .layers)")
        return value


def init_mix(options: ElmoOptions, n_mixes: int = 1) -> dict:
    """Scalar-mix parameters that start as an equal average of the layers.

    Args:
        options: the biLM's `ElmoOptions` (its L+1 output layers).
        n_mixes: how many mixes (AllenNLP's num_output_representations).

    Returns:
        {"weights": [n_mixes, L+1] float32 zeros (softmax gives equal weights),
        "gamma": [n_mixes] float32 ones}.

    Raises:
        ValueError: `n_mixes` < 1.
    """
    if n_mixes < 1:
        raise ValueError(f"n_mixes must be >= 1, got {n_mixes}")
    return {"weights": jnp.zeros((n_mixes, options.n_output_layers), jnp.float32),
            "gamma": jnp.ones((n_mixes,), jnp.float32)}


def _layer_norm(x: jax.Array, mask: jax.Array) -> jax.Array:
    """AllenNLP's ScalarMix layer norm: one mean and variance over all unmasked
    elements of the layer x [B, T, W] (mask [B, T])."""
    m = mask[..., None].astype(x.dtype)
    n = jnp.maximum(jnp.sum(m) * x.shape[-1], 1.0)
    mean = jnp.sum(x * m) / n
    var = jnp.sum(((x * m - mean) * m) ** 2) / n
    return (x - mean) / jnp.sqrt(var + 1e-13)


def mix_weights(mix: dict) -> jax.Array:
    """The mixes' layer weights [n_mixes, K]: softmax of the raw scalars."""
    return jax.nn.softmax(jnp.asarray(mix["weights"]), axis=-1)


def scalar_mix(layers: jax.Array, mask: jax.Array, mix: dict, layer_norm: bool = False):
    """AllenNLP's ScalarMix: gamma * sum_k softmax(w)_k * layer_k, for each mix.

    Args:
        layers: [K, B, T, W] float, the layer stack (`EmbedOutput.layers`).
        mask: [B, T] bool, True at real tokens (used by the layer norm).
        mix: parameters from `init_mix` (weights [n_mixes, K], gamma [n_mixes]).
        layer_norm: normalise each layer over its unmasked elements first
            (AllenNLP's do_layer_norm).

    Returns:
        (a tuple of n_mixes [B, T, W] arrays, the weights [n_mixes, K] after
        the softmax).
    """
    weights = mix_weights(mix)
    if layer_norm:
        layers = jax.vmap(_layer_norm, in_axes=(0, None))(layers, mask)
    mixed = jnp.einsum("nk,kbtw->nbtw", weights, layers) * mix["gamma"][:, None, None, None]
    return tuple(mixed), weights


_STATIC = ("options", "mix_layer_norm", "unroll", "dtype", "segments", "forward_mode")


# The jitted programs are keyed on the network alone (`ElmoOptions.network`)
# and a canonical dtype: two options files of one network that differ in a
# training field (batch_size, n_epochs, ...) share one compiled program, and
# so do dtype="bfloat16" and jnp.bfloat16. `encode_tokens`, `embed` and
# `embed_token_vectors` make that key and run `encode_tokens_program`,
# `embed_program` and `embed_token_vectors_program`, the jitted functions
# themselves (public, as lm1b keeps its jax.jit objects: `.lower()` for a
# plan, the compile cache for a count).


def encode_tokens(params: dict, char_ids: jax.Array, options: ElmoOptions) -> jax.Array:
    """Context-independent token vectors: the character CNN, the highway layers
    and the projection (half of layer 0), without the LSTMs.

    Args:
        params: the biLM's parameters.
        char_ids: [..., C] int32 character ids of tokens (`batch_to_char_ids`).
        options: the model's `ElmoOptions` (static).

    Returns:
        [..., P] float32 token vectors (P = options.lstm.projection_dim).
    """
    return encode_tokens_program(params, char_ids, options.network())


@functools.partial(jax.jit, static_argnames=("options", "forward_mode"))
def encode_tokens_program(params: dict, char_ids: jax.Array, options: ElmoOptions,
                          forward_mode: bool = False) -> jax.Array:
    return BiLM(options, forward_mode=forward_mode).apply({"params": params}, char_ids,
                                                         method=BiLM.encode_tokens)


class ArgumentError(UserError, TypeError, ValueError):
    """A mistake in what was passed to `embed` (or the modules): the message
    names it and says what to pass, in one line. Raised at trace time or in
    the eager wrapper, never inside the compiled program (a TypeError and a
    ValueError, so that either `except` catches it)."""


def check_options(options, where: str = "embed") -> ElmoOptions:
    """`options` if it is an `ElmoOptions`; else a one-line ArgumentError."""
    if isinstance(options, ElmoOptions):
        return options
    if isinstance(options, (str, os.PathLike)):
        raise ArgumentError(f"{where} takes an ElmoOptions, not the path {os.fspath(options)!r}: "
                            f"pass ElmoOptions.from_json({os.fspath(options)!r}) (or "
                            "open_model(path).options)")
    raise ArgumentError(f"{where}(params, char_ids, options): options must be an ElmoOptions, "
                        f"got {type(options).__name__} (are the arguments in another order?)")


def check_params(params, options: ElmoOptions, where: str = "embed") -> None:
    """One line naming the first parameter that the options' biLM does not
    have, or has in another shape (params and options of two models)."""
    if not isinstance(params, Mapping):
        what = type(params).__name__
        raise ArgumentError(f"{where}(params, char_ids, options): params must be the biLM's "
                            f"parameter dict (open_model(...).params), got {what}"
                            + (" (are params and char_ids swapped?)"
                               if hasattr(params, "shape") else ""))
    want = param_shapes(options.network())
    got = {name: tuple(np.shape(leaf)) for name, leaf in named_leaves(params).items()}
    for name, shape in want.items():
        if got.get(name, shape) != shape:
            raise ArgumentError(f"params do not match the options: {name} is {list(got[name])}, "
                                f"the options' biLM has {list(shape)} (params and options of "
                                "two models?)")
    missing = sorted(set(want) - set(got))
    if missing:
        raise ArgumentError(f"params do not match the options: no {missing[0]} (params and "
                            "options of two models?)")


def check_char_ids(char_ids, options: ElmoOptions, where: str = "embed"):
    """`char_ids` as an array ([B, T, C] or one sentence's [T, C]), checked:
    integers wide enough for the model's ids, and outside `jit` (numpy or a
    list) within its tables."""
    if isinstance(char_ids, str) or (isinstance(char_ids, (list, tuple)) and _holds_str(char_ids)):
        raise ArgumentError(f"{where} takes character ids, not token strings: pass "
                            "batch_to_char_ids(sentences) (or use Elmo.embed_sentences)")
    if isinstance(char_ids, Mapping):
        raise ArgumentError(f"{where}(params, char_ids, options): char_ids is a dict (are params "
                            "and char_ids swapped?)")
    if isinstance(char_ids, (list, tuple)):
        char_ids = np.asarray(char_ids)
    if not hasattr(char_ids, "dtype") or not hasattr(char_ids, "ndim"):
        raise ArgumentError(f"{where}: char_ids must be an integer array [batch, tokens, chars], "
                            f"got {type(char_ids).__name__}")
    cnn = options.char_cnn
    if not jnp.issubdtype(char_ids.dtype, jnp.integer):
        raise ArgumentError(f"{where}: char_ids must be integers, got {char_ids.dtype}")
    rows = max(cnn.table_rows, cnn.n_words)
    if jnp.iinfo(char_ids.dtype).max < rows - 1:
        raise ArgumentError(f"{where}: char_ids are {char_ids.dtype}, which cannot hold this "
                            f"model's ids (up to {rows - 1}): pass int32, as batch_to_char_ids "
                            "makes them")
    if char_ids.ndim not in (2, 3):
        raise ArgumentError(f"{where}: char_ids must be [batch, tokens, chars] (or one "
                            f"sentence's [tokens, chars]), got shape {tuple(char_ids.shape)}")
    if isinstance(char_ids, np.ndarray) and char_ids.size:  # concrete: the range is checked
        chars = char_ids[..., :cnn.max_characters_per_token]
        lo, hi = int(chars.min()), int(chars.max())
        if lo < 0 or hi >= cnn.table_rows:
            raise ArgumentError(f"{where}: char_ids hold {hi if hi >= cnn.table_rows else lo}, "
                                f"outside this model's character table (0..{cnn.table_rows - 1})")
        if cnn.spelling == "lexicon" and cnn.word_dim and char_ids.shape[-1] > chars.shape[-1]:
            words = char_ids[..., -1]
            if words.min() < 0 or words.max() >= cnn.n_words:
                raise ArgumentError(f"{where}: word ids outside this model's word table "
                                    f"(0..{cnn.n_words - 1})")
    return char_ids


def _holds_str(x) -> bool:
    while isinstance(x, (list, tuple)) and x:
        x = x[0]
    return isinstance(x, str)


def check_mix(mix, options: ElmoOptions) -> None:
    """A scalar mix for this biLM's L+1 layers ({"weights", "gamma"})."""
    if not isinstance(mix, Mapping) or "weights" not in mix or "gamma" not in mix:
        raise ArgumentError("mix must be {'weights': [n_mixes, L+1], 'gamma': [n_mixes]}, as "
                            "init_mix(options) makes it" + (
                                f"; it has {sorted(mix)}" if isinstance(mix, Mapping) else ""))
    K = options.n_output_layers
    if np.shape(mix["weights"])[-1:] != (K,) or len(np.shape(mix["weights"])) != 2:
        raise ArgumentError(f"mix['weights'] has shape {list(np.shape(mix['weights']))}; this "
                            f"biLM has {K} layers: [n_mixes, {K}] (init_mix(options))")
    if np.shape(mix["gamma"]) != np.shape(mix["weights"])[:1]:
        raise ArgumentError(f"mix['gamma'] has shape {list(np.shape(mix['gamma']))}; it needs "
                            f"one per mix: [{np.shape(mix['weights'])[0]}]")


def program_key(options: ElmoOptions, dtype) -> tuple:
    """(options.network(), the dtype as a numpy dtype): the programs' static key."""
    return options.network(), jnp.dtype(dtype)


def embed(params: dict, char_ids: jax.Array, options: ElmoOptions,
          state: LSTMState | None = None, mix: dict | None = None, *,
          mix_layer_norm: bool = False, unroll: int = 1, dtype=jnp.float32,
          segments: tuple | None = None, forward_mode: bool = False) -> EmbedOutput:
    """ELMo representations of a batch: a pure function of the parameters and
    the character ids (the options are static), so it goes under `jax.jit`,
    `jax.grad`, `jax.vmap` and a sharded `jit`.

    Args:
        params: the biLM's parameters (`open_model(...).params`,
            `load_weights`, `init_params` or training).
        char_ids: [B, T, C] int32 from `batch_to_char_ids`: real tokens first in
            each row, then all-zero padding tokens. `chars.trim_padding` may cut
            C first (the same output, a cheaper character CNN); any other C
            under the options' must not cut a token's spelling. One
            sentence's [T, C] gives outputs without the batch axis (layers
            [L+1, T, 2P], mask [T]), so `jax.vmap` over a batch's first axis
            equals the batched call. A type that cannot hold the model's ids
            (uint8), token strings, or (for numpy ids) ids outside its tables
            are an `ArgumentError`.
        options: the model's `ElmoOptions` (static: its network is the jit key).
        state: an LSTMState for B rows to continue from (stateful use, as
            bilm-tf's), or None to start from zeros (the default: a sentence
            always gets the same vectors).
        mix: scalar-mix parameters from `init_mix`; adds `mixed` and
            `mix_weights`. The mix is taken over positions including
            `<S>`/`</S>`, as AllenNLP does, so its layer norm sees the same
            elements.
        mix_layer_norm: AllenNLP's `do_layer_norm` for the mix.
        unroll: the `lax.scan` unroll of the LSTMs.
        dtype: the matmuls' input dtype (bfloat16 on accelerators; the cell
            state and gates stay float32).
        segments: a packed schedule for rows sorted by length (see
            `embed_token_vectors`).
        forward_mode: run the kernels' plain formulas, which forward-mode
            autodiff (`jax.jvp`, `jax.jacfwd`, `jax.hessian`) goes through;
            the default kernels have hand-written backward passes
            (`jax.custom_vjp`), which JAX cannot run forward ("can't apply
            forward-mode autodiff (jvp) to a custom_vjp function"). The
            values are the same; reverse mode then runs XLA's own gradients,
            slower on the CPU (docs/guides/embedding.md gives the cost).

    Returns:
        An `EmbedOutput`: layers [L+1, B, T, 2P], mask [B, T], the new state,
        and the mixes when `mix` is given.
    """
    options = check_options(options)
    check_params(params, options)
    char_ids = check_char_ids(char_ids, options)
    if mix is not None:
        check_mix(mix, options)
    one = char_ids.ndim == 2  # one sentence: a batch of one, and back
    if one:
        char_ids = char_ids[None]
        state = None if state is None else jax.tree.map(lambda a: a[:, :, None], state)
    options, dtype = program_key(options, dtype)
    out = embed_program(params, char_ids, options, state, mix, mix_layer_norm=mix_layer_norm,
                        unroll=unroll, dtype=dtype, segments=segments, forward_mode=forward_mode)
    if not one:
        return out
    return EmbedOutput(out.layers[:, 0], out.mask[0], jax.tree.map(lambda a: a[:, :, 0], out.state),
                       None if out.mix_weights is None else tuple(m[0] for m in out.mixed),
                       out.mix_weights)


@functools.partial(jax.jit, static_argnames=_STATIC)
def embed_program(params: dict, char_ids: jax.Array, options: ElmoOptions,
                  state: LSTMState | None = None, mix: dict | None = None, *,
                  mix_layer_norm: bool = False, unroll: int = 1, dtype=jnp.float32,
                  segments: tuple | None = None, forward_mode: bool = False) -> EmbedOutput:
    if char_ids.ndim != 3:
        raise ValueError(f"char_ids must be [batch, tokens, chars], got shape {char_ids.shape}")
    C, widest = options.char_cnn.max_characters_per_token, options.char_cnn.widest_filter
    if options.char_cnn.spelling == "lexicon":
        if char_ids.shape[2] != options.char_cnn.ids_per_token:
            raise ValueError(f"char_ids have {char_ids.shape[2]} ids per token; this model "
                             f"spells a token with {options.char_cnn.ids_per_token} "
                             "(`lexicon.Lexicon.batch_ids`)")
    elif not widest <= char_ids.shape[2] <= C:  # fewer than C: cut by `chars.trim_padding`
        raise ValueError(f"char_ids have {char_ids.shape[2]} characters per token; the options "
                         f"say {C} (or fewer, cut by chars.trim_padding, but at least the "
                         f"widest filter, {widest})")
    if not jnp.issubdtype(char_ids.dtype, jnp.integer):
        raise TypeError(f"char_ids must be integers, got {char_ids.dtype}")
    tokens = encode_tokens_program(params, char_ids.astype(jnp.int32), options, forward_mode)
    return embed_token_vectors_program(params, tokens, token_mask(char_ids), options, state, mix,
                                       mix_layer_norm=mix_layer_norm, unroll=unroll, dtype=dtype,
                                       segments=segments, forward_mode=forward_mode)


def embed_token_vectors(params: dict, tokens: jax.Array, mask: jax.Array, options: ElmoOptions,
                        state: LSTMState | None = None, mix: dict | None = None, *,
                        mix_layer_norm: bool = False, unroll: int = 1,
                        dtype=jnp.float32, segments: tuple | None = None,
                        forward_mode: bool = False) -> EmbedOutput:
    """`embed` from token vectors instead of character ids: the same output.

    Args:
        params: the biLM's parameters.
        tokens: [B, T, P] float token vectors (from `encode_tokens`, or a cache
            of them), zero or anything at padded positions.
        mask: [B, T] bool, True at real tokens (each row's first tokens).
        options: the model's `ElmoOptions` (static).
        state: an LSTMState for B rows to continue from, or None (zeros).
        mix: scalar-mix parameters from `init_mix`, or None.
        mix_layer_norm: AllenNLP's do_layer_norm for the mix.
        unroll: the `lax.scan` unroll of the LSTMs.
        dtype: the matmuls' input dtype.
        segments: `bilm.packed_segments(lengths + 2)` for rows sorted by
            length, longest first: the LSTMs then skip most padding (as
            AllenNLP does); None runs every row over all T.
        forward_mode: the kernels' plain formulas, for `jax.jvp` (`embed`).

    Returns:
        An `EmbedOutput`, as `embed`'s.
    """
    options, dtype = program_key(options, dtype)
    return embed_token_vectors_program(params, tokens, mask, options, state, mix,
                                       mix_layer_norm=mix_layer_norm, unroll=unroll, dtype=dtype,
                                       segments=segments, forward_mode=forward_mode)


@functools.partial(jax.jit, static_argnames=_STATIC)
def embed_token_vectors_program(params: dict, tokens: jax.Array, mask: jax.Array,
                                options: ElmoOptions, state: LSTMState | None = None,
                                mix: dict | None = None, *, mix_layer_norm: bool = False,
                                unroll: int = 1, dtype=jnp.float32, segments: tuple | None = None,
                                forward_mode: bool = False) -> EmbedOutput:
    if tokens.ndim != 3 or tokens.shape[-1] != options.lstm.projection_dim:
        raise ValueError(f"tokens must be [batch, tokens, {options.lstm.projection_dim}], "
                         f"got shape {tokens.shape}")
    B, T, _ = tokens.shape
    if B == 0:
        raise ValueError("embed got an empty batch (0 rows)")
    if state is None:
        state = init_state(options, B)
    elif state.h.shape[2] != B:
        raise ValueError(f"state has {state.h.shape[2]} rows but the batch has {B}; "
                         "slice or pad the state to the batch")
    model = BiLM(options, unroll=unroll, dtype=dtype, segments=segments, forward_mode=forward_mode)
    full, full_mask, new_state = model.apply({"params": params}, tokens, mask, state,
                                             method=BiLM.sentences)

    def strip(a):  # drop <S> and </S>; zero padded tokens
        return a[..., 1:T + 1, :] * mask[..., None]

    out = EmbedOutput(layers=strip(full), mask=mask, state=new_state)
    if mix is not None:
        mixed, weights = scalar_mix(full, full_mask, mix, mix_layer_norm)
        out = out._replace(mixed=tuple(strip(m) for m in mixed), mix_weights=weights)
    return out
