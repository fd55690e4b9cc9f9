"""`embed`: character ids -> the ELMo layer stack, plus the learned scalar mix.

`embed` is a pure function of (params, char_ids[, state][, mix]); the options
are static. It is jitted with `options` and `mix_layer_norm` static, and works
under `jax.grad`, `jax.vmap` and a sharded `jax.jit` (no Python control flow
on data). `Elmo` is a thin, stateful convenience wrapper for notebooks.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.files import atomic_path
from elmo_jax.model import BiLM, LSTMState, init_state, packed_segments, token_mask
from elmo_jax.options import ElmoOptions
from elmo_jax.weights import load_weights


class EmbedOutput(NamedTuple):
    """What `embed` returns (a pytree).

    layers:      [L+1, B, T, 2P] layer 0 = token vectors duplicated, then one per
                 LSTM layer (forward half, backward half); zero at padded tokens.
    mask:        [B, T] bool, True at real tokens.
    state:       LSTMState after the last real position of each row.
    mixed:       one [B, T, 2P] array per scalar mix, or None without `mix`.
    mix_weights: [n_mixes, L+1] softmax-normalised mix weights, or None."""
    layers: jax.Array
    mask: jax.Array
    state: LSTMState
    mixed: tuple | None = None
    mix_weights: jax.Array | None = None


def init_mix(options: ElmoOptions, n_mixes: int = 1) -> dict:
    """Scalar-mix parameters for `n_mixes` mixes: weights [n_mixes, L+1] = 0
    (so softmax gives equal weights) and gamma [n_mixes] = 1."""
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


def scalar_mix(layers: jax.Array, mask: jax.Array, mix: dict, layer_norm: bool = False):
    """gamma * sum_k softmax(w)_k * layer_k for each mix.

    layers [K, B, T, W], mask [B, T] -> (tuple of [B, T, W], weights [n_mixes, K])."""
    weights = jax.nn.softmax(mix["weights"], axis=-1)
    if layer_norm:
        layers = jax.vmap(_layer_norm, in_axes=(0, None))(layers, mask)
    mixed = jnp.einsum("nk,kbtw->nbtw", weights, layers) * mix["gamma"][:, None, None, None]
    return tuple(mixed), weights


_STATIC = ("options", "mix_layer_norm", "unroll", "dtype", "segments")


@functools.partial(jax.jit, static_argnames=("options",))
def encode_tokens(params: dict, char_ids: jax.Array, options: ElmoOptions) -> jax.Array:
    """[..., C] char ids -> [..., P] context-independent token vectors (the
    char CNN, highway layers and projection: half of layer 0)."""
    return BiLM(options).apply({"params": params}, char_ids, method=BiLM.encode_tokens)


@functools.partial(jax.jit, static_argnames=_STATIC)
def embed(params: dict, char_ids: jax.Array, options: ElmoOptions,
          state: LSTMState | None = None, mix: dict | None = None, *,
          mix_layer_norm: bool = False, unroll: int = 1, dtype=jnp.float32,
          segments: tuple | None = None) -> EmbedOutput:
    """ELMo representations of a batch.

    params:   biLM parameters (`load_weights`, `init_params` or training).
    char_ids: [B, T, C] int32 from `batch_to_char_ids` (real tokens first in
              each row, then all-zero padding tokens); `chars.trim_padding`
              may cut C first (the same output, a cheaper character CNN; any
              other C under the options' must not cut a token's spelling).
    state:    LSTMState for B rows to continue from (stateful use), or None to
              start from zeros (the default: a sentence always gets the same vectors).
    mix:      scalar-mix parameters from `init_mix`; adds `mixed` and `mix_weights`.
              The mix is taken over positions including `<S>`/`</S>`, as AllenNLP
              does, so its optional layer norm sees the same elements.
    unroll, dtype, segments: speed knobs: `lax.scan` unroll, the matmul input
              dtype (bf16 on accelerators; cell state and gates stay float32), and a
              packed schedule for rows sorted by length (see `embed_token_vectors`)."""
    if char_ids.ndim != 3:
        raise ValueError(f"char_ids must be [batch, tokens, chars], got shape {char_ids.shape}")
    C, widest = options.char_cnn.max_characters_per_token, options.char_cnn.widest_filter
    if not widest <= char_ids.shape[2] <= C:  # fewer than C: cut by `chars.trim_padding`
        raise ValueError(f"char_ids have {char_ids.shape[2]} characters per token; the options "
                         f"say {C} (or fewer, cut by chars.trim_padding, but at least the "
                         f"widest filter, {widest})")
    if not jnp.issubdtype(char_ids.dtype, jnp.integer):
        raise TypeError(f"char_ids must be integers, got {char_ids.dtype}")
    tokens = encode_tokens(params, char_ids.astype(jnp.int32), options)
    return embed_token_vectors(params, tokens, token_mask(char_ids), options, state, mix,
                               mix_layer_norm=mix_layer_norm, unroll=unroll, dtype=dtype,
                               segments=segments)


@functools.partial(jax.jit, static_argnames=_STATIC)
def embed_token_vectors(params: dict, tokens: jax.Array, mask: jax.Array, options: ElmoOptions,
                        state: LSTMState | None = None, mix: dict | None = None, *,
                        mix_layer_norm: bool = False, unroll: int = 1,
                        dtype=jnp.float32, segments: tuple | None = None) -> EmbedOutput:
    """`embed` from token vectors [B, T, P] (from `encode_tokens`, or a cache of
    them) and mask [B, T] instead of char ids; same output.

    segments: `model.packed_segments(lengths + 2)` for rows sorted by length,
              longest first: the LSTMs then skip most padding (as AllenNLP does)."""
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
    model = BiLM(options, unroll=unroll, dtype=dtype, segments=segments)
    full, full_mask, new_state = model.apply({"params": params}, tokens, mask, state,
                                             method=BiLM.sentences)

    def strip(a):  # drop <S> and </S>; zero padded tokens
        return a[..., 1:T + 1, :] * mask[..., None]

    out = EmbedOutput(layers=strip(full), mask=mask, state=new_state)
    if mix is not None:
        mixed, weights = scalar_mix(full, full_mask, mix, mix_layer_norm)
        out = out._replace(mixed=tuple(strip(m) for m in mixed), mix_weights=weights)
    return out


def bucket(n: int, smallest: int = 8) -> int:
    """The next power of two >= n (at least `smallest`): few distinct shapes,
    so few compilations."""
    b = smallest
    while b < n:
        b *= 2
    return b


class Elmo:
    """Embed token lists from a notebook: `Elmo.from_files(o, w).embed_sentences(s)`.

    Batches are sorted by length and padded to power-of-two lengths and batch
    sizes, so that new inputs rarely trigger a compilation. Each distinct token
    of a batch goes through the character CNN once; with `cache_vocab` (a list
    of words, like bilm-tf's `dump_token_embeddings`) the vectors of those words
    are computed once up front and reused, and other tokens fall back to the
    character CNN. Stateless batches are packed: rows sorted by length, and the
    LSTMs skip the padding of shorter rows (`pack=False` turns this off). With
    `stateful=True` the LSTM state of each batch row is carried from one call to
    the next (bilm-tf's behaviour; sentences are then neither reordered nor
    packed). `dtype` and `unroll` are embed's speed knobs."""

    def __init__(self, params: dict, options: ElmoOptions, stateful: bool = False,
                 min_length_bucket: int = 8, cache_vocab: Sequence[str] | None = None,
                 pack: bool = True, dtype=jnp.float32, unroll: int = 1):
        self.params = jax.device_put(params)
        self.options = options
        self.stateful = stateful
        self.min_length_bucket = min_length_bucket
        self.pack = pack and not stateful
        self.dtype, self.unroll = dtype, unroll
        self.state: LSTMState | None = None
        self._cached: dict[str, int] = {}
        self._cache = np.zeros((0, options.lstm.projection_dim), np.float32)
        if cache_vocab is not None:
            self.cache_tokens(cache_vocab)

    @classmethod
    def from_files(cls, options_json: str | os.PathLike, weights_hdf5: str | os.PathLike,
                   **kwargs) -> "Elmo":
        options = ElmoOptions.from_json(options_json)
        return cls(load_weights(weights_hdf5, options), options, **kwargs)

    @classmethod
    def from_export(cls, path: str | os.PathLike, **kwargs) -> "Elmo":
        """From an export folder (`train.py export`), or a weights file with its
        options.json beside it."""
        from elmo_jax.export import load_export

        exported = load_export(path)
        return cls(exported.params, exported.options, **kwargs)

    def reset_state(self) -> None:
        self.state = None

    def cache_tokens(self, words: Sequence[str], chunk: int = 1024) -> None:
        """Precompute and keep the token vectors [len(words), P] of `words`."""
        words = [w for w in dict.fromkeys(words) if w not in self._cached]
        vectors = [self._encode(words[i:i + chunk]) for i in range(0, len(words), chunk)]
        for w in words:
            self._cached[w] = len(self._cached)
        if vectors:
            self._cache = np.concatenate([self._cache] + vectors)

    def token_vectors(self, tokens: Sequence[str]) -> np.ndarray:
        """[n, P] context-independent vectors: cached words from the cache, the
        rest through the character CNN."""
        out = np.zeros((len(tokens), self.options.lstm.projection_dim), np.float32)
        misses = [i for i, t in enumerate(tokens) if t not in self._cached]
        hits = [i for i, t in enumerate(tokens) if t in self._cached]
        if hits:
            out[hits] = self._cache[[self._cached[tokens[i]] for i in hits]]
        if misses:
            out[misses] = self._encode([tokens[i] for i in misses])
        return out

    def _encode(self, tokens: Sequence[str]) -> np.ndarray:
        C = self.options.char_cnn.max_characters_per_token
        ids = np.zeros((bucket(len(tokens), 16), C), np.int32)
        for i, t in enumerate(tokens):
            ids[i] = chars.token_to_char_ids(t, C)
        ids = chars.trim_padding(ids, self.options.char_cnn.widest_filter)
        return np.asarray(encode_tokens(self.params, ids, self.options))[:len(tokens)]

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 64
                        ) -> list[np.ndarray]:
        """One float32 array [L+1, n_tokens, 2P] per sentence, in input order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _check_sentences(sentences)
        order = list(range(len(sentences)))
        if not self.stateful:
            order.sort(key=lambda i: len(sentences[i]))
        result: list[np.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            layers = self._embed_batch([sentences[i] for i in idx])
            for row, i in enumerate(idx):
                result[i] = layers[:, row, :len(sentences[i])]
        return result

    def _embed_batch(self, batch) -> np.ndarray:
        """[L+1, len(batch), T, 2P] for the sentences of one batch, in order."""
        order = list(range(len(batch)))
        lengths = [len(s) for s in batch]
        T = bucket(max(lengths), self.min_length_bucket)
        rows = len(batch) if self.stateful else bucket(len(batch), 1)
        # Pack (longest first, LSTMs skip the padding) only when padding would be
        # much of the work: a length-sorted corpus then reuses a few compiled shapes.
        pack = self.pack and sum(n + 2 for n in lengths) < 0.5 * rows * (T + 2)
        if pack:
            order.sort(key=lambda i: -lengths[i])
            T = -(-(max(lengths) + 2) // 8) * 8 - 2
            rows = -(-len(batch) // 8) * 8
        distinct = list(dict.fromkeys(t for s in batch for t in s))
        vectors = self.token_vectors(distinct)
        where = {t: i for i, t in enumerate(distinct)}
        tokens = np.zeros((rows, T, self.options.lstm.projection_dim), np.float32)
        mask = np.zeros((rows, T), bool)
        for b, i in enumerate(order):
            s = batch[i]
            if s:
                tokens[b, :len(s)] = vectors[[where[t] for t in s]]
                mask[b, :len(s)] = True
        segments = packed_segments(mask.sum(1) + 2) if pack else None
        state = self._stateful_rows(rows) if self.stateful else None
        out = embed_token_vectors(self.params, tokens, mask, self.options, state,
                                  dtype=self.dtype, unroll=self.unroll, segments=segments)
        if self.stateful:
            self.state = jax.tree.map(lambda full, new: full.at[:, :, :rows].set(new),
                                      self.state, out.state)
        layers = np.asarray(out.layers)
        return layers[:, np.argsort(order)]

    def _stateful_rows(self, rows: int) -> LSTMState:
        """The carried state of the first `rows` rows, growing the store with
        zero rows when a batch is larger than any before it."""
        if self.state is None or self.state.h.shape[2] < rows:
            grown = init_state(self.options, rows)
            if self.state is not None:
                n = self.state.h.shape[2]
                grown = jax.tree.map(lambda g, s: g.at[:, :, :n].set(s), grown, self.state)
            self.state = grown
        return jax.tree.map(lambda s: s[:, :, :rows], self.state)


def _check_sentences(sentences) -> None:
    """The errors `batch_to_char_ids` gives, without building the char ids."""
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError("embed_sentences takes a list of sentences, each a list of token strings")
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise TypeError(f"sentence {i} is a str, not a list of tokens: split it first")
        for j, t in enumerate(s):
            if not isinstance(t, str) or not t:
                raise (TypeError if not isinstance(t, str) else ValueError)(
                    f"sentence {i}, token {j}: a token must be a non-empty str, got {t!r}")


def dump_embeddings(elmo: Elmo, sentences: Sequence[Sequence[str]], path: str | os.PathLike,
                    batch_size: int = 64, layer: int | None = None,
                    mix_weights: Sequence[float] | None = None, gamma: float = 1.0,
                    chunk: int = 4096, progress: bool = False) -> int:
    """Write an hdf5 file in bilm-tf's `dump_bilm_embeddings` layout: dataset
    str(i) for sentence i, float32 [L+1, n_i, 2P]; with `layer`, that layer
    [n_i, 2P]; with `mix_weights` (raw scalars, softmax-normalised as in the
    scalar mix), gamma * the weighted sum [n_i, 2P]. The file appears whole or
    not at all. Returns the number of sentences."""
    import h5py
    from tqdm import tqdm

    K = elmo.options.n_output_layers
    if layer is not None and not 0 <= layer < K:
        raise ValueError(f"--layer must be in 0..{K - 1}, got {layer}")
    if mix_weights is not None:
        if len(mix_weights) != K:
            raise ValueError(f"the mix needs {K} weights (one per layer), got {len(mix_weights)}")
        w = np.exp(np.asarray(mix_weights, np.float64) - np.max(mix_weights))
        w = (gamma * w / w.sum()).astype(np.float32)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as fh, \
            tqdm(total=len(sentences), disable=not progress, unit="sent") as bar:
        for start in range(0, len(sentences), chunk):
            part = sentences[start:start + chunk]
            for i, arr in enumerate(elmo.embed_sentences(part, batch_size=batch_size)):
                if layer is not None:
                    arr = arr[layer]
                elif mix_weights is not None:
                    arr = np.einsum("k,knd->nd", w, arr)
                fh.create_dataset(str(start + i), data=arr.astype(np.float32))
            bar.update(len(part))
    return len(sentences)
