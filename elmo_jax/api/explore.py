"""Looking at embeddings: contextual and static nearest neighbours, and a 2-D
projection. Used by the demo and the quick-start notebook."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from elmo_jax.api.elmo import Elmo


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def occurrences(sentences: Sequence[Sequence[str]], forms: set[str], limit: int | None = None
                ) -> list[tuple[int, int]]:
    """(sentence index, token index) of every token whose lower case is in `forms`."""
    out = []
    for i, s in enumerate(sentences):
        for j, t in enumerate(s):
            if t.lower() in forms:
                out.append((i, j))
                if limit is not None and len(out) >= limit:
                    return out
    return out


def vectors_at(elmo: Elmo, sentences: Sequence[Sequence[str]], where: list[tuple[int, int]],
               layer: int, batch_size: int = 64) -> np.ndarray:
    """[len(where), 2P]: the layer's vector of each (sentence, token) position."""
    needed = sorted({i for i, _ in where})
    embedded = dict(zip(needed, elmo.embed_sentences([sentences[i] for i in needed], batch_size)))
    return np.stack([embedded[i][layer, j] for i, j in where])


def contextual_neighbours(elmo: Elmo, query: Sequence[str], position: int,
                          pool: Sequence[Sequence[str]], pool_where: list[tuple[int, int]],
                          pool_vectors: np.ndarray, layer: int, k: int = 3):
    """The k pool occurrences whose `layer` vectors are closest (cosine) to the
    query token's: [(similarity, sentence index, token index)]."""
    q = elmo.embed_sentences([list(query)])[0][layer, position]
    sims = _unit(pool_vectors) @ _unit(q)
    best = np.argsort(-sims)[:k]
    return [(float(sims[b]), *pool_where[b]) for b in best]


def static_neighbours(elmo: Elmo, word: str, vocabulary: Sequence[str], k: int = 5):
    """The k vocabulary words whose context-independent (layer 0) vectors are
    closest (cosine) to `word`'s: [(similarity, word)]."""
    elmo.cache_tokens(vocabulary)
    words = [w for w in vocabulary if w != word]
    sims = _unit(elmo.token_vectors(words)) @ _unit(elmo.token_vectors([word])[0])
    best = np.argsort(-sims)[:k]
    return [(float(sims[b]), words[b]) for b in best]


def pca2(x: np.ndarray) -> np.ndarray:
    """[n, d] -> [n, 2]: the first two principal components."""
    x = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T


def snippet(tokens: Sequence[str], j: int, width: int = 6) -> str:
    """The words around token j, with it in [brackets]."""
    left = " ".join(tokens[max(0, j - width):j])
    right = " ".join(tokens[j + 1:j + 1 + width])
    return f"{left} [{tokens[j]}] {right}".strip()
