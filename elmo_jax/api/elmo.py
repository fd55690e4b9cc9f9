"""`Elmo`: ELMo for notebooks and scripts: token lists in, one float32 array
[L+1, n_tokens, 2P] per sentence out (a thin, stateful wrapper over `embed`),
or its scalar mix [n_tokens, 2P], or a sentence vector [2P] (the mix's mean
over the tokens, as TF-Hub's ELMo `default`).

    elmo = Elmo.from_pretrained("original")        # a registry name, URL or path
    vectors = elmo.embed_sentences([["Hello", "world", "."]], output="mean")
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core import chars
from elmo_jax.core.embedding import embed_token_vectors, encode_tokens
from elmo_jax.core.embedding import mix_weights as normalized_mix
from elmo_jax.core.lexicon import Lexicon
from elmo_jax.core.bilm import LSTMState, init_state, packed_segments
from elmo_jax.core.options import ElmoOptions
from elmo_jax.core.batching import next_power_of_two, round_up, windows


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
    packed). `dtype` and `unroll` are embed's speed knobs. `lexicon` spells the
    tokens of a model whose options say so (ELMoForManyLangs', `lexicon.py`).

    A stateless sentence longer than `max_length` tokens is embedded in
    overlapping windows of `max_length` tokens (`windows`), each token taking
    its vectors from the window where it is furthest from an edge: memory
    stays bounded (a 44,000-token "sentence" works), and each token still sees
    at least `max_length // 8` tokens of context on either side of it.

    Args:
        params: the biLM's parameters (put on the default device once).
        options: the model's `ElmoOptions`.
        stateful: carry each batch row's LSTM state to the next call.
        min_length_bucket: the shortest padded length.
        cache_vocab: words whose token vectors are computed once up front.
        pack: let the LSTMs skip the padding of shorter rows (stateless).
        dtype: the matmuls' input dtype (bfloat16 on accelerators).
        unroll: the LSTMs' `lax.scan` unroll.
        lexicon: the dictionaries of a model that spells with them (and
            only of such a model).
        max_length: the longest stateless sentence embedded whole (>= 8).

    Raises:
        ValueError: a lexicon given to a UTF-8 model or missing from a
            lexicon model; max_length < 8.
    """

    def __init__(self, params: dict, options: ElmoOptions, stateful: bool = False,
                 min_length_bucket: int = 8, cache_vocab: Sequence[str] | None = None,
                 pack: bool = True, dtype=jnp.float32, unroll: int = 1,
                 lexicon: Lexicon | None = None, max_length: int = 512):
        if (lexicon is not None) != (options.char_cnn.spelling == "lexicon"):
            raise ValueError("a model whose options spell tokens with a lexicon needs it "
                             "(lexicon=), and only such a model takes one")
        if max_length < 8:
            raise ValueError(f"max_length must be >= 8, got {max_length}")
        self.params = jax.device_put(params)
        self.options = options
        self.lexicon = lexicon
        self.max_length = max_length
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
        """From AllenNLP's pair of files, as its `Elmo(options_file, weight_file)`.

        Args:
            options_json: the options file (local, a bucket path or a URL).
            weights_hdf5: the bilm-tf hdf5 weights file.
            **kwargs: the constructor's settings (`stateful`, `dtype`, ...).

        Returns:
            An `Elmo` (`open_model(weights_hdf5, options_json)`).
        """
        from elmo_jax.formats.stored_model import open_model

        stored = open_model(weights_hdf5, options_json)
        return cls(stored.params, stored.options, lexicon=stored.lexicon, **kwargs)

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, options: str | os.PathLike | None = None,
                        **kwargs) -> "Elmo":
        """A published or stored model, by name, URL or path.

        Args:
            model: a registry name ("original", "manylangs-zhs": `elmo-jax
                models`), a URL (a weights file's, or an archive's), or a
                stored model (`open_model`: an export folder, a weights file, a
                training workdir, an ELMoForManyLangs folder; local or in a
                bucket).
            options: the options file of a weights file or weights URL.
            **kwargs: the constructor's settings (`stateful`, `dtype`, ...).

        Returns:
            An `Elmo` holding the model's parameters (and lexicon).

        Raises:
            UserError: an unknown name (with the near ones), a missing or
                damaged file, weights that do not match their options.
        """
        from elmo_jax.formats.stored_model import open_model

        stored = open_model(model, options)
        return cls(stored.params, stored.options, lexicon=stored.lexicon, **kwargs)


    def reset_state(self) -> None:
        """Forget the carried LSTM state (stateful use): the next batch starts
        from zeros, as a new document would."""
        self.state = None

    def cache_tokens(self, words: Sequence[str], chunk: int = 1024) -> None:
        """Precompute and keep the token vectors of `words` (bilm-tf's
        `dump_token_embeddings`): later batches take them from the cache.

        Args:
            words: the words (repeats and cached ones are skipped).
            chunk: words through the character CNN at a time.
        """
        words = [w for w in dict.fromkeys(words) if w not in self._cached]
        vectors = [self._encode(words[i:i + chunk]) for i in range(0, len(words), chunk)]
        for w in words:
            self._cached[w] = len(self._cached)
        if vectors:
            self._cache = np.concatenate([self._cache] + vectors)

    def token_vectors(self, tokens: Sequence[str]) -> np.ndarray:
        """Context-independent token vectors: cached words from the cache, the
        rest through the character CNN.

        Args:
            tokens: n token strings.

        Returns:
            [n, P] float32 numpy vectors.
        """
        out = np.zeros((len(tokens), self.options.lstm.projection_dim), np.float32)
        misses = [i for i, t in enumerate(tokens) if t not in self._cached]
        hits = [i for i, t in enumerate(tokens) if t in self._cached]
        if hits:
            out[hits] = self._cache[[self._cached[tokens[i]] for i in hits]]
        if misses:
            out[misses] = self._encode([tokens[i] for i in misses])
        return out

    def _encode(self, tokens: Sequence[str]) -> np.ndarray:
        c = self.options.char_cnn
        C = c.max_characters_per_token
        ids = np.zeros((next_power_of_two(len(tokens), 16), c.ids_per_token), np.int32)
        for i, t in enumerate(tokens):
            ids[i] = (self.lexicon.token_ids(t, C) if self.lexicon is not None
                      else chars.token_to_char_ids(t, C))
        if self.lexicon is None:
            ids = chars.trim_padding(ids, c.widest_filter)
        return np.asarray(encode_tokens(self.params, ids, self.options))[:len(tokens)]

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 64,
                        output: str = "layers", mix_weights: Sequence[float] | None = None,
                        gamma: float = 1.0) -> list[np.ndarray]:
        """The ELMo vectors of each sentence.

        Args:
            sentences: token lists (an empty list gives an empty list).
            batch_size: sentences a batch.
            output: "layers" ([L+1, n_tokens, 2P], every layer), "mix"
                ([n_tokens, 2P]: gamma times the softmax(mix_weights)-weighted
                sum of the layers, equal weights by default) or "mean" ([2P]:
                the mix's mean over the tokens, TF-Hub's ELMo `default`; zeros
                for an empty sentence).
            mix_weights: the mix's raw weights, one per layer.
            gamma: the mix's scale.

        Returns:
            One float32 array per sentence, in input order.
        """
        if output not in ("layers", "mix", "mean"):
            raise ValueError(f"output must be 'layers', 'mix' or 'mean', got {output!r}")
        layers = self._embed_layers(sentences, batch_size)
        if output == "layers":
            return layers
        K = self.options.n_output_layers
        raw = np.zeros(K, np.float32) if mix_weights is None else np.asarray(mix_weights,
                                                                            np.float32)
        if raw.shape != (K,):
            raise ValueError(f"the mix needs {K} weights (one per layer), got {raw.size}")
        w = gamma * np.asarray(normalized_mix({"weights": raw[None]})[0])
        mixed = [np.einsum("k,knd->nd", w, a) for a in layers]
        if output == "mix":
            return mixed
        return [m.mean(axis=0) if len(m) else np.zeros(m.shape[1], np.float32) for m in mixed]

    def _embed_layers(self, sentences, batch_size: int) -> list[np.ndarray]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _check_sentences(sentences)
        if not self.stateful and any(len(s) > self.max_length for s in sentences):
            return self._embed_windowed(sentences, batch_size)
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

    def _embed_windowed(self, sentences, batch_size: int) -> list[np.ndarray]:
        """Sentences longer than max_length as overlapping windows (`windows`)."""
        pieces, plan = [], []
        for s in sentences:
            spans = windows(len(s), self.max_length)
            plan.append((len(pieces), spans))
            pieces += [s[a:b] for a, b, _, _ in spans]
        embedded = self._embed_layers(pieces, batch_size)
        out = []
        for first, spans in plan:
            parts = [embedded[first + k][:, keep_a - a:keep_b - a]
                     for k, (a, _, keep_a, keep_b) in enumerate(spans)]
            out.append(np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
        return out

    def _embed_batch(self, batch) -> np.ndarray:
        """[L+1, len(batch), T, 2P] for the sentences of one batch, in order."""
        order = list(range(len(batch)))
        lengths = [len(s) for s in batch]
        T = next_power_of_two(max(lengths), self.min_length_bucket)
        rows = len(batch) if self.stateful else next_power_of_two(len(batch), 1)
        # Pack (longest first, LSTMs skip the padding) only when padding would be
        # much of the work: a length-sorted corpus then reuses a few compiled shapes.
        pack = self.pack and sum(n + 2 for n in lengths) < 0.5 * rows * (T + 2)
        if pack:
            order.sort(key=lambda i: -lengths[i])
            T = round_up(max(lengths) + 2, 8) - 2
            rows = round_up(len(batch), 8)
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
