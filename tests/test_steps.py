"""The pure train and eval steps: bilm-tf's `sample_softmax: false` trains on
the exact full softmax, which equals the evaluation loss of the same parameters
on the same batch (no dropout)."""
import collections
import math
import types

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bilm_batcher import Batcher
from conftest import grammar_sentences, tiny_options_dict
from elmo_jax import ElmoOptions
from elmo_jax.config import TrainConfig
from elmo_jax.core.bilm import init_state
from elmo_jax.core.softmax import PAD_BIAS
from elmo_jax.training.partitioning import check_divisible
from elmo_jax.training.steps import eval_step, init_train_state, loss_fn
from elmo_jax.core.vocab import build_vocab


def _setup(sample_softmax):
    sentences = grammar_sentences(40, 0)
    vocab = build_vocab(collections.Counter(w for s in sentences for w in s))
    options = ElmoOptions.from_dict(dict(tiny_options_dict(), dropout=0.0, batch_size=4,
                                         unroll_steps=6, n_negative_samples_batch=8,
                                         sample_softmax=sample_softmax,
                                         n_tokens_vocab=len(vocab)))
    config = TrainConfig()
    state = init_train_state(options, config, len(vocab))
    batch = next(Batcher(iter(sentences), vocab, options.batch_size, options.unroll_steps))
    return options, config, state, batch, len(vocab)


@pytest.mark.slow
def test_full_softmax_training_loss_equals_the_eval_loss():
    options, config, state, batch, V = _setup(sample_softmax=False)
    assert options.n_negative_samples_batch < V  # the option, not the size, picks the full one
    rng = jax.random.PRNGKey(3)
    loss, (per_dir, _) = loss_fn(state.params, batch, state.lstm_state, rng, options, config)
    _, nll, n = eval_step(state.params, init_state(options, options.batch_size), batch,
                          options=options, config=config)
    np.testing.assert_allclose(np.asarray(per_dir), np.asarray(nll) / float(n), rtol=1e-5)
    assert float(loss) == pytest.approx(0.5 * float(np.sum(nll)) / float(n), rel=1e-5)


def test_sampled_softmax_is_the_default():
    options, config, state, batch, _ = _setup(sample_softmax=None)
    rng = jax.random.PRNGKey(3)
    loss, _ = loss_fn(state.params, batch, state.lstm_state, rng, options, config)
    _, nll, n = eval_step(state.params, state.lstm_state, batch, options=options, config=config)
    assert abs(float(loss) - 0.5 * float(np.sum(nll)) / float(n)) > 1e-3


def test_softmax_starts_as_the_samplers_unigram_model_or_as_bilm_tf():
    """The default start: each word's bias is the log-probability of its rank
    under the log-uniform law (float64 numpy here), so the untrained full softmax
    is that unigram model; padding rows stay out. bilm-tf's start: biases 0."""
    options = ElmoOptions.from_dict(tiny_options_dict())
    V = 300  # padded to 384 rows
    k = np.arange(V, dtype=np.float64)
    law = np.log((k + 2) / (k + 1)) / np.log(V + 1)
    params = init_train_state(options, TrainConfig(), V).params["softmax"]
    b = np.asarray(params["b"])
    assert b.shape == (384,) and np.all(b[V:] == PAD_BIAS)
    np.testing.assert_allclose(b[:V], np.log(law), rtol=1e-5)
    with_zero_rows = jax.nn.softmax(params["b"])  # the softmax at a zero hidden state
    np.testing.assert_allclose(np.asarray(with_zero_rows)[:V], law, rtol=1e-4)
    bilm_tf = init_train_state(options, TrainConfig(softmax_init="bilm-tf"), V).params["softmax"]
    assert np.all(np.asarray(bilm_tf["b"])[:V] == 0.0)
    np.testing.assert_array_equal(bilm_tf["w"], params["w"])  # the same rows either way


def test_a_large_softmax_is_split_within_one_host_by_default():
    """train.mesh_model 0: the 1B Word Benchmark's softmax is split over the
    largest power of two up to 8 that divides the devices and fits one host
    (the shards exchange rows every step: never across hosts by default)."""
    from elmo_jax.config import load_config
    from elmo_jax.training.partitioning import auto_mesh_model

    original = load_config("original").model
    assert auto_mesh_model(793_471, original, 64) == 8
    assert auto_mesh_model(793_471, original, 64, devices_per_host=4) == 4
    assert auto_mesh_model(793_471, original, 12) == 4
    assert auto_mesh_model(10_000, original, 64) == 1  # a small softmax stays whole


class _FakeDevice:
    """What `device_grid` reads of a device: its host, and (not a TPU) its platform."""
    platform, device_kind = "gpu", "fake"

    def __init__(self, id, process_index, coords=None):
        self.id, self.process_index, self.coords = id, process_index, coords

    def __repr__(self):
        return f"D{self.id}@{self.process_index}"


def test_the_mesh_keeps_each_model_group_within_a_host_and_each_host_one_block_of_rows():
    """`device_grid`: whatever order the devices come in (here hosts interleaved,
    as a topology may list them), every model-axis group lies in one host and
    each host's devices are whole, consecutive rows (a process's batch rows one
    block); where a host cannot hold the model axis the given order stays."""
    from elmo_jax.training.partitioning import device_grid

    devices = [_FakeDevice(i, i % 4) for i in range(32)]  # 4 hosts of 8, interleaved
    for model in (1, 2, 4, 8):
        grid = device_grid(devices, model)
        assert grid.shape == (32 // model, model)
        assert all(len({d.process_index for d in row}) == 1 for row in grid)
        hosts = [d.process_index for d in grid.ravel()]
        assert hosts == sorted(hosts)  # each host one block of rows, in host order
        assert sorted(d.id for d in grid.ravel()) == list(range(32))
    # chips with coordinates (4 hosts of 2 x 2 on a 4 x 4 grid), listed in a
    # different order on each host: every host's block lists its chips in the
    # first host's order, so each data-axis group is one place of every host
    grid = [(x, y) for y in range(4) for x in range(4)]
    chips = [_FakeDevice(i, (x // 2) + 2 * (y // 2), [x, y, 0])
             for i, (x, y) in enumerate(sorted(grid, key=lambda c: (c[0] * 7 + c[1] * 3) % 16))]
    placed = device_grid(chips, 2).reshape(4, 2, 2)  # [host, its rows, model]
    places = [[[(d.coords[0] % 2, d.coords[1] % 2) for d in row] for row in host]
              for host in placed]
    assert all(p == places[0] for p in places), places
    assert len({d.process_index for d in placed[0].ravel()}) == 1
    wide = device_grid(devices, 16)  # wider than a host: as given
    assert [d.id for d in wide.ravel()] == list(range(32))
    with pytest.raises(ValueError, match="does not divide"):
        device_grid(devices, 3)


@settings(max_examples=300, deadline=None)
@given(edge=st.integers(0, 5000), start=st.integers(1, 3000), multiple=st.sampled_from([1, 8, 64]),
       limit=st.integers(64, 4096))
def test_the_largest_batch_search_finds_the_edge_of_a_monotone_fit(edge, start, multiple, limit):
    """`largest_fitting` (the plan's --largest_batch, one compile a probe): for a
    fit that holds up to `edge`, the largest multiple of `multiple` that fits and
    is within the limit, in a logarithmic number of probes."""
    from elmo_jax.training.plan import largest_fitting

    probes = []

    def fits(rows):
        assert rows >= multiple and rows % multiple == 0
        probes.append(rows)
        return rows <= edge

    found = largest_fitting(fits, start, multiple, limit)
    best = max([r for r in range(multiple, limit + 1, multiple) if r <= edge], default=0)
    assert found == best
    assert len(probes) <= 2 * math.log2(max(limit, start) / multiple + 2) + 3


def test_a_batch_that_does_not_split_names_the_devices_and_the_process():
    options = ElmoOptions.from_dict(dict(tiny_options_dict(), batch_size=8))
    three_devices = types.SimpleNamespace(size=3, shape={"model": 1})
    with pytest.raises(ValueError, match=r"batch_size 8 must divide evenly over the 3 devices "
                                         r"and 1 process$"):
        check_divisible(options, 100, three_devices)
