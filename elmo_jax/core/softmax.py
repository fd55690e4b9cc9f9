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

The draws themselves follow TF's law exactly for any V (`exact_log_uniform_draws`:
two stages whose float32 arithmetic loses nothing). TF's own formula,
floor(exp(u * log(V + 1))) - 1, is exact in TF's double precision but not in
float32, where it cannot reach part of a large vocabulary (at V = 793,471 a
fifth of the ids above 600,000) and draws their neighbours too often.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.core.batching import round_up

_NEG = -jnp.finfo(jnp.float32).max  # TF adds -FLT_MAX to accidental hits

# The matrix's rows: the vocabulary padded to a multiple of SOFTMAX_ROW_MULTIPLE,
# so that any power-of-two model axis up to it divides them. A padding row is
# never a label and never sampled, and its probability in the full softmax is
# exactly 0 (bias PAD_BIAS). Checkpoints keep the padding; exports do not.
SOFTMAX_ROW_MULTIPLE = 128
PAD_BIAS = -1e9


def softmax_rows(vocab_size: int) -> int:
    """Rows of the softmax matrix: the vocabulary, padded."""
    return round_up(vocab_size, SOFTMAX_ROW_MULTIPLE)


def pad_softmax(softmax: dict, vocab_size: int) -> dict:
    """A softmax of `vocab_size` rows {"w": [V, P], "b": [V]} (an export's)
    padded to `softmax_rows(V)` rows."""
    extra = softmax_rows(vocab_size) - softmax["w"].shape[0]
    return {"w": jnp.pad(jnp.asarray(softmax["w"]), ((0, extra), (0, 0))),
            "b": jnp.pad(jnp.asarray(softmax["b"]), (0, extra), constant_values=PAD_BIAS)}


def unpad_softmax(softmax: dict, vocab_size: int) -> dict:
    """The vocabulary's rows {"w": [V, P], "b": [V]} of a padded softmax."""
    return {"w": softmax["w"][:vocab_size], "b": softmax["b"][:vocab_size]}


class Candidates(NamedTuple):
    """S sampled classes and what the loss needs to know about them."""
    ids: jax.Array        # [S] int32 class ids, distinct where valid
    valid: jax.Array      # [S] bool
    num_tries: jax.Array  # [] int32 draws it took to find them


def log_uniform_prob(ids, vocab_size: int):
    """P(k) = log((k + 2) / (k + 1)) / log(V + 1) of the log-uniform (Zipfian)
    distribution over 0..V-1 (log1p: accurate for large k in float32, where the
    difference of two logs is not)."""
    ids = jnp.asarray(ids, jnp.float32)
    return jnp.log1p(1.0 / (ids + 1.0)) / math.log(vocab_size + 1.0)


def _blocks(vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the blocks [2^j, 2^(j+1)) of m = k + 1 in 1..V (the last block
    cut at V + 1) and each block's log-probability, computed in float64."""
    edges = [1]
    while edges[-1] * 2 <= vocab_size:
        edges.append(edges[-1] * 2)
    edges.append(vocab_size + 1)
    e = np.array(edges, np.float64)
    return np.array(edges, np.int64), np.log(np.log(e[1:] / e[:-1]) / math.log(vocab_size + 1.0))


def draw_in_blocks(key: jax.Array, lo: jax.Array, hi: jax.Array, tries: int = 32) -> jax.Array:
    """m in [lo, hi) with P(m) proportional to log(1 + 1/m), for each of the
    [n] blocks given, by rejection from the uniform: a proposal is accepted with
    P(m) / P(lo), at least 1/2 in a block no wider than lo. After `tries`
    proposals (probability below 2^-tries) the last one is kept."""
    k_prop, k_acc = jax.random.split(key)
    m = jax.random.randint(k_prop, (tries,) + lo.shape, lo, hi)
    accept = jnp.log1p(1.0 / m.astype(jnp.float32)) / jnp.log1p(1.0 / lo.astype(jnp.float32))
    accepted = jax.random.uniform(k_acc, m.shape) < accept
    first = jnp.where(jnp.any(accepted, axis=0), jnp.argmax(accepted, axis=0), tries - 1)
    return jnp.take_along_axis(m, first[None], axis=0)[0]


def exact_log_uniform_draws(key: jax.Array, n: int, vocab_size: int) -> jax.Array:
    """n independent draws [n] int32 of the log-uniform law over 0..V-1, exact
    for every k: m = k + 1 has a power-of-two block [2^j, 2^(j+1)) drawn by the
    blocks' exact probabilities (about 24 of them, each at least log 2 / log(V+1)),
    then a value within the block (`draw_in_blocks`)."""
    edges, log_p = _blocks(vocab_size)
    k_block, k_value = jax.random.split(key)
    j = jax.random.categorical(k_block, jnp.asarray(log_p, jnp.float32), shape=(n,))
    lo = jnp.asarray(edges[:-1], jnp.int32)[j]
    hi = jnp.asarray(edges[1:], jnp.int32)[j]
    return draw_in_blocks(k_value, lo, hi) - 1


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
    draws = exact_log_uniform_draws(key, M, vocab_size)
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
    return sampled_softmax_from_rows(hidden, labels, w[labels], b[labels], candidates,
                                     w[candidates.ids], b[candidates.ids], true_expected,
                                     sampled_expected, remove_accidental_hits)


def sampled_softmax_from_rows(hidden, labels, true_w, true_b, candidates: Candidates,
                              cand_w, cand_b, true_expected, sampled_expected,
                              remove_accidental_hits: bool = True) -> jax.Array:
    """`sampled_softmax_loss` from the softmax rows already gathered: the
    labels' [N, P] and [N], the candidates' [S, P] and [S] (from wherever the
    matrix lives: `sharded_rows` gathers them from the shards of a split one)."""
    true_logits = jnp.sum(hidden * true_w, axis=-1) + true_b                     # [N]
    sampled_logits = hidden @ cand_w.T + cand_b                                  # [N, S]
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


def chunked_logsumexp(w: jax.Array, b: jax.Array, hidden: jax.Array, chunk: int) -> jax.Array:
    """logsumexp over the vocabulary of hidden @ w.T + b: [N], `chunk` rows of w
    at a time (a running max and sum), so that neither the forward pass nor
    the gradient (each chunk is recomputed) holds the [N, V] logits."""
    V, N = w.shape[0], hidden.shape[0]
    if V <= chunk:
        return jax.nn.logsumexp(hidden @ w.T + b, axis=1)
    n_chunks = round_up(V, chunk) // chunk

    @jax.checkpoint
    def body(carry, i):
        m, total = carry
        start = jnp.minimum(i * chunk, V - chunk)          # the last chunk overlaps:
        fresh = start + jnp.arange(chunk) >= i * chunk     # rows seen before are masked
        logits = hidden @ jax.lax.dynamic_slice_in_dim(w, start, chunk).T \
            + jax.lax.dynamic_slice_in_dim(b, start, chunk)
        logits = jnp.where(fresh[None, :], logits, -1e30)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        total = total * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[:, None]), axis=1)
        return (m_new, total), None

    init = (jnp.full((N,), -1e30, hidden.dtype), jnp.zeros((N,), hidden.dtype))
    (m, total), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
    return m + jnp.log(total)


def chunked_softmax_loss(w: jax.Array, b: jax.Array, hidden: jax.Array, labels: jax.Array,
                         chunk: int) -> jax.Array:
    """`full_softmax_loss` [N] in vocabulary chunks (`chunked_logsumexp`)."""
    return chunked_logsumexp(w, b, hidden, chunk) - (jnp.sum(hidden * w[labels], axis=-1)
                                                     + b[labels])


ROWS = ("data", "model")  # mesh axes the batch rows are split over (all of them)


def _gather_model(x, axis):
    """x from every device of this data slice along `axis` (rows in device order)."""
    return jax.lax.all_gather(x, "model", axis=axis, tiled=True)


def _own_part(x, n: int, axis: int):
    """This device's n rows of a gathered x."""
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("model") * n, n, axis)


def _rows_here(w, b, ids):
    """Rows of this softmax shard for the ids it holds; zeros for the others."""
    here = ids - jax.lax.axis_index("model") * w.shape[0]
    inside = (here >= 0) & (here < w.shape[0])
    idx = jnp.clip(here, 0, w.shape[0] - 1)
    return (jnp.where(inside[..., None], w[idx], 0.0), jnp.where(inside, b[idx], 0.0),
            inside, idx)


def sharded_rows(w: jax.Array, b: jax.Array, ids: jax.Array, mesh, split_ids: bool):
    """(w[ids], b[ids]) when the rows of w [V, P] and b [V] are split over the
    mesh's "model" axis: each shard contributes the rows it holds and one
    all-reduce of the gathered rows (never of w) completes them. ids are [D, N]
    split like the batch rows (`split_ids`: the data slice's ids gathered, and
    a reduce-scatter gives each device its own rows), or the same on every
    device."""
    from jax.sharding import PartitionSpec as P

    def local(w, b, ids):
        if split_ids:  # the labels of every device of this data slice
            ids = _gather_model(ids, -1)
        rows, bias, _, _ = _rows_here(w, b, ids)
        if split_ids:  # each device keeps only its own labels' rows: reduce-scatter
            return (jax.lax.psum_scatter(rows, "model", scatter_dimension=rows.ndim - 2,
                                         tiled=True),
                    jax.lax.psum_scatter(bias, "model", scatter_dimension=bias.ndim - 1,
                                         tiled=True))
        return jax.lax.psum(rows, "model"), jax.lax.psum(bias, "model")

    spec = P(None, ROWS) if split_ids else P()
    return jax.shard_map(local, mesh=mesh, in_specs=(P("model"), P("model"), spec),
                         out_specs=(spec, spec), check_vma=False)(w, b, ids)


def sharded_full_softmax_loss(w: jax.Array, b: jax.Array, hidden: jax.Array,
                              labels: jax.Array, mesh, chunk: int) -> jax.Array:
    """Exact full-softmax loss [D, N] with the vocabulary split over "model":
    hidden [D, N, P] and labels [D, N] split like the batch rows. The rows of
    a data slice are gathered (small: N x P), each shard takes their
    logsumexp over its part of the vocabulary in chunks, and all-reduces over
    "model" combine the shards' results and the label logits."""
    from jax.sharding import PartitionSpec as P

    def local(w, b, h, y):
        D, n, H = h.shape
        h, y = _gather_model(h, 1).reshape(-1, H), _gather_model(y, 1).reshape(-1)
        lse_here = chunked_logsumexp(w, b, h, chunk)
        m = jax.lax.pmax(jax.lax.stop_gradient(lse_here), "model")
        lse = m + jnp.log(jax.lax.psum(jnp.exp(lse_here - m), "model"))
        _, _, inside, idx = _rows_here(w, b, y)
        target = jnp.where(inside, jnp.sum(h * w[idx], axis=-1) + b[idx], 0.0)
        loss = (lse - jax.lax.psum(target, "model")).reshape(D, -1)
        return _own_part(loss, n, 1)

    spec = P(None, ROWS)
    return jax.shard_map(local, mesh=mesh, in_specs=(P("model"), P("model"), spec, spec),
                         out_specs=spec, check_vma=False)(w, b, hidden, labels)
