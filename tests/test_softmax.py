"""Sampled softmax: TF's mathematics, checked against the full softmax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.softmax import (Candidates, expected_count, full_softmax_loss, log_uniform_prob,
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
