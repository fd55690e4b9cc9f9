"""Sampled softmax: TF's mathematics, checked against the full softmax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.core.softmax import (Candidates, expected_count, full_softmax_loss, log_uniform_prob,
                              log_uniform_sample, num_draws, sampled_softmax,
                              sampled_softmax_loss)

V, P = 50, 8
LABELS = jnp.array([0, 1, 3, 7, 20, 49])


@pytest.fixture(scope="module")
def problem():
    w = jax.random.normal(jax.random.PRNGKey(0), (V, P))
    b = 0.5 * jax.random.normal(jax.random.PRNGKey(1), (V,))
    h = jax.random.normal(jax.random.PRNGKey(2), (len(LABELS), P))
    return w, b, h


def test_full_softmax_loss_is_cross_entropy(problem):
    w, b, h = problem
    logits = np.asarray(h, np.float64) @ np.asarray(w, np.float64).T + np.asarray(b, np.float64)
    want = np.log(np.exp(logits).sum(1)) - logits[np.arange(len(LABELS)), np.asarray(LABELS)]
    np.testing.assert_allclose(full_softmax_loss(w, b, h, LABELS), want, rtol=1e-5)


def test_every_class_sampled_equals_full_softmax(problem):
    """All V classes as candidates, each certain to be drawn (expected count 1):
    accidental-hit removal leaves exactly the full softmax."""
    w, b, h = problem
    cand = Candidates(jnp.arange(V), jnp.ones(V, bool), jnp.array(10**6))
    got = sampled_softmax_loss(w, b, h, LABELS, cand, jnp.ones(len(LABELS)), jnp.ones(V))
    np.testing.assert_allclose(got, full_softmax_loss(w, b, h, LABELS), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_gradient_estimate_approaches_full_softmax_gradient(problem):
    w, b, h = problem
    full = jax.grad(lambda w, b, h: full_softmax_loss(w, b, h, LABELS).mean(), (0, 1, 2))(w, b, h)
    keys = jax.random.split(jax.random.PRNGKey(3), 2000)
    errors = []
    for S in (10, 30, 49):
        g = jax.jit(jax.vmap(jax.grad(
            lambda k, w, b, h: sampled_softmax(k, w, b, h, LABELS, S).mean(), (1, 2, 3)),
            in_axes=(0, None, None, None)))(keys, w, b, h)
        errors.append(max(float(jnp.linalg.norm(gs.mean(0) - gf) / jnp.linalg.norm(gf))
                          for gs, gf in zip(g, full)))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.05, errors


def test_sampler_draws_distinct_log_uniform_classes():
    keys = jax.random.split(jax.random.PRNGKey(4), 3000)
    S = 20
    cand = jax.jit(jax.vmap(lambda k: log_uniform_sample(k, S, V)))(keys)
    ids = np.asarray(cand.ids)
    assert np.asarray(cand.valid).all()
    assert all(len(set(row)) == S for row in ids[:200])
    # the first draw of each sample follows P(k) = log((k+2)/(k+1)) / log(V+1)
    freq = np.bincount(ids[:, 0], minlength=V) / len(ids)
    np.testing.assert_allclose(freq[:5], np.asarray(log_uniform_prob(jnp.arange(5), V)), atol=0.03)
    # TF's expected count tracks how often each class is really among the S
    inclusion = np.zeros(V)
    for row in ids:
        inclusion[row] += 1
    inclusion /= len(ids)
    ec = jax.vmap(lambda t: expected_count(jnp.arange(V), t, S, V))(cand.num_tries).mean(0)
    np.testing.assert_allclose(inclusion, np.asarray(ec), atol=0.04)
    assert int(cand.num_tries.min()) >= S


def test_too_many_samples_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot sample 50 distinct classes"):
        num_draws(50, 50)


V_LM1B = 793471  # the One Billion Word Benchmark's vocabulary


def _critical_chi2(df, z=5.0):
    """Wilson-Hilferty: the chi-square value exceeded with probability ~3e-7."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.slow
def test_exact_sampler_follows_the_log_uniform_law_at_lm1b_size():
    from elmo_jax.core.softmax import exact_log_uniform_draws

    n = 2_000_000
    draws = np.asarray(jax.jit(lambda k: exact_log_uniform_draws(k, n, V_LM1B))(
        jax.random.PRNGKey(7)))
    assert draws.min() >= 0 and draws.max() < V_LM1B
    m = draws + 1
    # bins in m: geometric over the whole range, and fine ones over the top ids
    edges = np.unique(np.concatenate([np.round(np.geomspace(1, 600_000, 40)),
                                      np.linspace(600_000, V_LM1B + 1, 41)]).astype(np.int64))
    counts = np.histogram(m, bins=edges)[0]
    p = np.log(edges[1:] / edges[:-1]) / np.log(V_LM1B + 1.0)
    assert p.sum() == pytest.approx(1.0)
    expected = n * p
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < _critical_chi2(len(counts) - 1), chi2
    # reachability: the number of distinct ids seen above 600,000 is what the law
    # predicts (float32's exp(u * log(V + 1)) leaves a fifth of them unreachable)
    top = np.arange(600_000, V_LM1B)
    p_top = np.log1p(1.0 / (top + 1.0)) / np.log(V_LM1B + 1.0)
    seen_mean = np.sum(1 - np.exp(-n * p_top))
    seen_sd = np.sqrt(np.sum(np.exp(-n * p_top) * (1 - np.exp(-n * p_top))))
    seen = len(np.unique(draws[draws >= 600_000]))
    assert abs(seen - seen_mean) < 5 * seen_sd, (seen, seen_mean, seen_sd)


def test_every_id_of_the_top_block_is_drawn():
    """The within-block stage reaches every id: the last 472 ids of the lm1b
    vocabulary and the top of a 10M one."""
    from elmo_jax.core.softmax import draw_in_blocks

    for lo, hi in ((793_000, V_LM1B + 1), (10_000_000 - 300, 10_000_001)):
        lo_a, hi_a = jnp.full((40_000,), lo, jnp.int32), jnp.full((40_000,), hi, jnp.int32)
        got = np.asarray(draw_in_blocks(jax.random.PRNGKey(1), lo_a, hi_a))
        assert set(got.tolist()) == set(range(lo, hi))


def test_expected_counts_stay_accurate_for_large_ids():
    k = jnp.array([0, 1000, 600_000, V_LM1B - 1])
    p = np.asarray(log_uniform_prob(k, V_LM1B), np.float64)
    want = np.log((np.asarray(k) + 2.0) / (np.asarray(k) + 1.0)) / np.log(V_LM1B + 1.0)
    np.testing.assert_allclose(p, want, rtol=1e-5)


@pytest.mark.slow
def test_chunked_full_softmax_equals_the_unchunked_loss_and_gradient():
    from elmo_jax.core.softmax import chunked_softmax_loss

    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    V, N, P = 1000, 37, 16
    w, b = jax.random.normal(ks[0], (V, P)), jax.random.normal(ks[1], (V,))
    h, y = 2 * jax.random.normal(ks[2], (N, P)), jax.random.randint(ks[3], (N,), 0, V)
    probe = jax.random.normal(ks[0], (N,))
    for chunk in (128, 333, 1000, 4096):  # uneven, overlapping last chunk, one, bigger
        f = lambda w, b, h: jnp.sum(probe * chunked_softmax_loss(w, b, h, y, chunk))  # noqa
        g = lambda w, b, h: jnp.sum(probe * full_softmax_loss(w, b, h, y))  # noqa
        np.testing.assert_allclose(chunked_softmax_loss(w, b, h, y, chunk),
                                   full_softmax_loss(w, b, h, y), rtol=2e-6, atol=2e-6)
        for a, r in zip(jax.grad(f, (0, 1, 2))(w, b, h), jax.grad(g, (0, 1, 2))(w, b, h)):
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_training_sampler_inclusions_match_expected_counts_at_lm1b_size():
    """What training uses (`log_uniform_sample`, S = 8,192 as the original
    config): how often ids of each range, the top ids included, are among the
    candidates agrees with TF's expected counts, the correction the loss applies."""
    S = 8192
    sample = jax.jit(jax.vmap(lambda k: log_uniform_sample(k, S, V_LM1B)))
    counts = jax.jit(jax.vmap(lambda t: expected_count(jnp.arange(V_LM1B), t, S, V_LM1B)))
    ids, ec = [], []
    for key in jax.random.split(jax.random.PRNGKey(11), 2):  # 2 x 64 samples, ~2.3M draws
        cand = sample(jax.random.split(key, 64))
        assert np.asarray(cand.valid).all()
        ids.append(np.asarray(cand.ids))
        ec.append(np.asarray(counts(cand.num_tries), np.float64))
    ids, ec = np.concatenate(ids), np.concatenate(ec)
    for lo, hi in ((0, 100), (100, 10_000), (10_000, 100_000), (100_000, 600_000),
                   (600_000, 700_000), (700_000, V_LM1B)):
        got = np.sum((ids >= lo) & (ids < hi))
        want = ec[:, lo:hi].sum()
        sd = np.sqrt(np.sum(ec[:, lo:hi] * (1 - ec[:, lo:hi])))
        assert abs(got - want) < 5 * sd + 1, (lo, hi, got, want, sd)
    # every id reachable: as many distinct top ids as the counts predict (TF's
    # float32 formula piles a fifth of them onto their neighbours)
    miss = np.prod(1 - ec[:, 700_000:], axis=0)
    seen = len(np.unique(ids[ids >= 700_000]))
    assert abs(seen - np.sum(1 - miss)) < 5 * np.sqrt(np.sum(miss * (1 - miss))), seen
