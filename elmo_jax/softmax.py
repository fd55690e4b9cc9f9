"""The softmax over the word vocabulary: log-uniform sampling, the sampled
softmax loss of `tf.nn.sampled_softmax_loss`, and the full softmax loss.

Shapes: N predictions, P hidden width, V vocabulary, S sampled classes.

The sampler draws like TF's `log_uniform_candidate_sampler(unique=True)`:
classes are drawn with replacement from P(k) = log((k + 2) / (k + 1)) / log(V + 1)
until S distinct ones are found, and the expected count of class k is
1 - (1 - P(k)) ** num_tries (or S * P(k) when no draw was rejected). To stay
jittable, a fixed number M of draws is made and the first S distinct ones are
kept; M is chosen so that finding fewer than S is vanishingly rare (missing
slots are then masked out, which only makes the estimate use fewer samples).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_NEG = -jnp.finfo(jnp.float32).max  # TF adds -FLT_MAX to accidental hits


class Candidates(NamedTuple):
    """S sampled classes and what the loss needs to know about them."""
    ids: jax.Array        # [S] int32 class ids, distinct where valid
    valid: jax.Array      # [S] bool
    num_tries: jax.Array  # [] int32 draws it took to find them


def log_uniform_prob(ids, vocab_size: int):
    """P(k) of the log-uniform (Zipfian) distribution over 0..V-1."""
    ids = jnp.asarray(ids, jnp.float32)
    return (jnp.log(ids + 2.0) - jnp.log(ids + 1.0)) / math.log(vocab_size + 1.0)


@functools.lru_cache(maxsize=64)
def num_draws(num_sampled: int, vocab_size: int) -> int:
    """M: draws after which S distinct classes are found with near certainty
    (the expected number of distinct classes exceeds S by 8 standard deviations)."""
    if num_sampled >= vocab_size:
        raise ValueError(f"cannot sample {num_sampled} distinct classes from a vocabulary of "
                         f"{vocab_size}: use fewer negative samples or the full softmax")
    k = np.arange(vocab_size, dtype=np.float64)
    p = (np.log(k + 2) - np.log(k + 1)) / np.log(vocab_size + 1)

    def distinct(n):  # mean and variance of the number of distinct classes in n draws
        q = np.exp(n * np.log1p(-p))
        return np.sum(1 - q), np.sum(q * (1 - q))

    lo, hi = num_sampled, num_sampled
    while True:
        mean, var = distinct(hi)
        if mean - 8 * math.sqrt(var) >= num_sampled:
            break
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 64):
        mid = (lo + hi) // 2
        mean, var = distinct(mid)
        lo, hi = (lo, mid) if mean - 8 * math.sqrt(var) >= num_sampled else (mid, hi)
    return int(hi)


def log_uniform_sample(key: jax.Array, num_sampled: int, vocab_size: int) -> Candidates:
    """S distinct classes in the order TF's unique sampler would find them."""
    M = num_draws(num_sampled, vocab_size)
    u = jax.random.uniform(key, (M,))
    draws = jnp.floor(jnp.exp(u * math.log(vocab_size + 1.0))) - 1.0
    draws = jnp.clip(draws, 0, vocab_size - 1).astype(jnp.int32)
    order = jnp.argsort(draws, stable=True)
    sorted_draws = draws[order]
    first_in_sorted = jnp.concatenate([jnp.ones((1,), bool), sorted_draws[1:] != sorted_draws[:-1]])
    is_new = jnp.zeros((M,), bool).at[order].set(first_in_sorted)  # first time this class appears
    n_distinct = jnp.cumsum(is_new)
    keep = is_new & (n_distinct <= num_sampled)
    slot = jnp.where(keep, n_distinct - 1, num_sampled)
    ids = jnp.zeros((num_sampled,), jnp.int32).at[slot].set(draws, mode="drop")
    valid = jnp.zeros((num_sampled,), bool).at[slot].set(True, mode="drop")
    num_tries = jnp.minimum(jnp.sum(n_distinct < num_sampled) + 1, M).astype(jnp.int32)
    return Candidates(ids, valid, num_tries)


def expected_count(ids, num_tries, num_sampled: int, vocab_size: int):
    """TF's expected count of each class among the S distinct samples."""
    p = log_uniform_prob(ids, vocab_size)
    tries = num_tries.astype(jnp.float32)
    return jnp.where(num_tries == num_sampled, p * num_sampled, -jnp.expm1(tries * jnp.log1p(-p)))


def sampled_softmax_loss(w: jax.Array, b: jax.Array, hidden: jax.Array, labels: jax.Array,
                         candidates: Candidates, true_expected: jax.Array,
                         sampled_expected: jax.Array,
                         remove_accidental_hits: bool = True) -> jax.Array:
    """Per-prediction loss [N], `tf.nn.sampled_softmax_loss`'s mathematics.

    w [V, P], b [V], hidden [N, P], labels [N]; the expected counts are [N] for
    the labels and [S] for the candidates (see `expected_count`)."""
    true_logits = jnp.sum(hidden * w[labels], axis=-1) + b[labels]              # [N]
    sampled_logits = hidden @ w[candidates.ids].T + b[candidates.ids]           # [N, S]
    true_logits = true_logits - jnp.log(true_expected)
    sampled_logits = sampled_logits - jnp.log(sampled_expected)
    drop = ~candidates.valid[None, :]
    if remove_accidental_hits:
        drop = drop | (labels[:, None] == candidates.ids[None, :])
    sampled_logits = jnp.where(drop, _NEG, sampled_logits)
    logits = jnp.concatenate([true_logits[:, None], sampled_logits], axis=1)
    return jax.nn.logsumexp(logits, axis=1) - true_logits


def sampled_softmax(key: jax.Array, w: jax.Array, b: jax.Array, hidden: jax.Array,
                    labels: jax.Array, num_sampled: int) -> jax.Array:
    """Draw candidates and return the per-prediction sampled softmax loss [N]."""
    V = w.shape[0]
    cand = log_uniform_sample(key, num_sampled, V)
    return sampled_softmax_loss(
        w, b, hidden, labels, cand,
        expected_count(labels, cand.num_tries, num_sampled, V),
        expected_count(cand.ids, cand.num_tries, num_sampled, V))


def full_softmax_loss(w: jax.Array, b: jax.Array, hidden: jax.Array, labels: jax.Array
                      ) -> jax.Array:
    """Per-prediction cross entropy [N] over the whole vocabulary."""
    logits = hidden @ w.T + b
    return jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(logits, labels[:, None], 1)[:, 0]
