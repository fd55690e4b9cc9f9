"""ELMo as a Flax module (linen and NNX): the mixes equal `embed`'s, the mix
is the only thing that trains unless fine-tuning, and it runs under jax.jit,
nn.jit / nnx.jit, a sharded jit and jax.grad."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import elmo_jax
from conftest import FIXTURES
from elmo_jax.api.flax_modules import BiLMWeights, ElmoEmbedder, NnxElmoEmbedder, init_variables

WEIGHTS = os.path.join(FIXTURES, "lm_weights.hdf5")
SENTENCES = [["The", "bank", "of", "the", "river", "."], ["Money", "!"]]


@pytest.fixture(scope="module")
def fixture_model():
    options = elmo_jax.ElmoOptions.from_json(os.path.join(FIXTURES, "options.json"))
    return options, elmo_jax.load_weights(WEIGHTS, options)


def _reference(options, params, ids, layer_norm=False):
    return elmo_jax.embed(params, ids, options, mix=elmo_jax.init_mix(options, 2),
                          mix_layer_norm=layer_norm).mixed


@pytest.mark.parametrize("layer_norm", [False, True])
def test_linen_module_equals_embed_and_trains_only_the_mix(fixture_model, layer_norm):
    options, params = fixture_model
    module = ElmoEmbedder.from_pretrained(WEIGHTS, n_mixes=2, layer_norm=layer_norm)
    ids = module.char_ids(SENTENCES)
    variables = module.init(jax.random.PRNGKey(0), ids)
    assert set(variables) == {"params", "bilm"}
    assert set(variables["params"]) == {"scalar_mix_weights", "gamma"}
    mixed, mask = module.apply(variables, ids)
    for got, want in zip(mixed, _reference(options, params, ids, layer_norm)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    assert np.asarray(mask).sum() == 8

    def loss(variables):
        (a, b), _ = module.apply(variables, ids)
        return jnp.sum(a ** 2) + jnp.sum(jnp.sin(b))

    grads = jax.jit(jax.grad(loss))(variables)
    assert all(not np.asarray(g).any() for g in jax.tree.leaves(grads["bilm"]))
    assert np.abs(np.asarray(grads["params"]["scalar_mix_weights"])).max() > 0


def test_from_pretrained_opens_the_weights_once_and_init_reads_no_file(monkeypatch):
    """`from_pretrained` opens the model once; `init` (and every apply) reads
    no file; the deprecated `weights_file` still works, with a warning."""
    import elmo_jax.formats.export

    reads = []
    real = elmo_jax.formats.export.load_weights
    monkeypatch.setattr(elmo_jax.formats.export, "load_weights",
                        lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    module = ElmoEmbedder.from_pretrained(WEIGHTS)
    assert reads == [WEIGHTS]
    variables = module.init(jax.random.PRNGKey(0), module.char_ids(SENTENCES))
    assert reads == [WEIGHTS]
    old = ElmoEmbedder(module.options, weights_file=WEIGHTS)
    with pytest.warns(DeprecationWarning, match="reads the file inside init"):
        old_variables = old.init(jax.random.PRNGKey(0), old.char_ids(SENTENCES))
    for a, b in zip(jax.tree.leaves(variables["bilm"]), jax.tree.leaves(old_variables["bilm"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fine_tune_puts_the_bilm_among_the_params(fixture_model):
    options, params = fixture_model
    module = ElmoEmbedder(options, weights=params, fine_tune=True)
    ids = module.char_ids(SENTENCES)
    variables = module.init(jax.random.PRNGKey(0), ids)
    assert set(variables) == {"params"} and "bilm" in variables["params"]
    grads = jax.grad(lambda p: jnp.sum(module.apply({"params": p}, ids)[0][0] ** 2))(
        variables["params"])
    assert np.abs(np.asarray(grads["bilm"]["lstm"]["layer_0"]["w_in"])).max() > 0


def test_init_variables_uses_weights_in_memory_and_dropout_is_there(fixture_model):
    options, params = fixture_model
    module = ElmoEmbedder(options, dropout=0.5)   # no file: the weights are given
    ids = module.char_ids(SENTENCES)
    variables = init_variables(module, jax.random.PRNGKey(0), ids, params)
    (quiet,), _ = module.apply(variables, ids)
    np.testing.assert_allclose(np.asarray(quiet),
                               np.asarray(elmo_jax.embed(params, ids, options,
                                                         mix=elmo_jax.init_mix(options)).mixed[0]),
                               atol=1e-6)
    (noisy,), _ = module.apply(variables, ids, deterministic=False,
                               rngs={"dropout": jax.random.PRNGKey(1)})
    dropped = np.asarray(noisy) == 0
    assert 0.3 < dropped[np.asarray(quiet) != 0].mean() < 0.7


def test_linen_under_nn_jit_and_a_sharded_jit(fixture_model):
    options, params = fixture_model

    class Tagger(nn.Module):  # ELMo inside a ten-line model
        @nn.compact
        def __call__(self, ids):
            (x,), mask = nn.jit(ElmoEmbedder)(options, dropout=0.0, random_bilm=True,
                                              name="elmo")(ids)
            return nn.Dense(3)(x), mask

    model = Tagger()
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    variables = model.init(jax.random.PRNGKey(0), ids)
    variables = {**variables, "bilm": {"elmo": {"weights": jax.tree.map(jnp.asarray, params)}}}
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    step = jax.jit(lambda v, ids: model.apply(v, ids)[0],
                   in_shardings=(replicated, batch), out_shardings=batch)
    scores = step(variables, ids)
    mix = variables["params"]["elmo"]
    direct = elmo_jax.embed(params, ids, options, mix={
        "weights": mix["scalar_mix_weights"], "gamma": mix["gamma"]}).mixed[0]
    dense = variables["params"]["Dense_0"]
    np.testing.assert_allclose(np.asarray(scores),
                               np.asarray(direct @ dense["kernel"] + dense["bias"]), atol=1e-5)


def test_nnx_module_matches_linen_and_freezes_the_bilm(fixture_model):
    options, params = fixture_model
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    model = NnxElmoEmbedder(options, params, n_mixes=2, dropout=0.5, rngs=nnx.Rngs(0))
    model.eval()
    mixed, _ = nnx.jit(lambda m, x: m(x))(model, ids)
    for got, want in zip(mixed, _reference(options, params, ids)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    grads = nnx.grad(lambda m: jnp.sum(m(ids)[0][0] ** 2))(model)
    assert set(grads.keys()) == {"scalar_mix_weights", "gamma"}
    assert isinstance(jax.tree.leaves(model.bilm, is_leaf=lambda v: isinstance(
        v, nnx.Variable))[0], BiLMWeights)
    tuned = NnxElmoEmbedder(options, params, fine_tune=True, dropout=0.0, rngs=nnx.Rngs(0))
    grads = nnx.grad(lambda m: jnp.sum(m(ids)[0][0] ** 2))(tuned)
    assert "bilm" in grads.keys()
