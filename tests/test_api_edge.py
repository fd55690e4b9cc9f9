"""ELMo inside a user's JAX model (issue 64): `embed` on one sentence's ids
under a per-example `jax.vmap` equals the batched call; the common mistakes at
the API's edge each get one line that says what to pass (never an
AttributeError, a KeyError or an error from JAX's or Flax's insides); linen and
NNX modules are deterministic until told to train and return the same named
output."""
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import elmo_jax
from conftest import FIXTURES, REPO
from elmo_jax.core.embedding import ArgumentError

WEIGHTS = os.path.join(FIXTURES, "lm_weights.hdf5")
OPTIONS = os.path.join(FIXTURES, "options.json")
SENTENCES = [["The", "bank", "of", "the", "river", "."], ["Money", "!"], ["a", "b", "c"]]


@pytest.fixture(scope="module")
def model():
    return elmo_jax.open_model(WEIGHTS)


def test_per_example_vmap_equals_the_batched_call(model):
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    mix = {"weights": jnp.array([[0.3, -0.1, 0.5]]), "gamma": jnp.array([1.2])}
    batched = elmo_jax.embed(model.params, ids, model.options, mix=mix)
    per = jax.vmap(lambda x: elmo_jax.embed(model.params, x, model.options, mix=mix))(ids)
    assert per.layers.shape == (3, 3, 6, 32)  # [B] + one sentence's [L+1, T, 2P]
    np.testing.assert_allclose(np.moveaxis(np.asarray(per.layers), 0, 1), batched.layers,
                               atol=1e-6)
    np.testing.assert_allclose(per.mixed[0], batched.mixed[0], atol=1e-6)
    np.testing.assert_array_equal(per.mask, batched.mask)
    np.testing.assert_allclose(np.moveaxis(np.asarray(per.state.h), 0, 2), batched.state.h,
                               atol=1e-6)
    one = elmo_jax.embed(model.params, ids[1], model.options)  # one sentence, no vmap
    assert one.layers.shape == (3, 6, 32) and one.mask.shape == (6,)
    np.testing.assert_allclose(one.layers, batched.layers[:, 1], atol=1e-6)
    # its state continues as a batch's row does
    again = elmo_jax.embed(model.params, ids[1], model.options, state=one.state)
    want = elmo_jax.embed(model.params, ids[1:2], model.options,
                          state=jax.tree.map(lambda a: a[:, :, 1:2], batched.state))
    np.testing.assert_allclose(again.layers, want.layers[:, 0], atol=1e-6)


def mistakes(model):
    """(what a user did, the call, words the one-line message must hold)."""
    p, o = model.params, model.options
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    other = elmo_jax.open_model(os.path.join(REPO, "tests", "fixtures", "manylangs", "tiny"))
    return [
        ("uint8 ids, already wrapped", lambda: elmo_jax.embed(p, ids.astype(np.uint8), o),
         "uint8, which cannot hold"),
        ("ids past the table", lambda: elmo_jax.embed(p, ids + 300, o), "outside this model"),
        ("float ids", lambda: elmo_jax.embed(p, ids.astype(np.float32), o), "integers"),
        ("arguments swapped", lambda: elmo_jax.embed(ids, p, o), "swapped"),
        ("char_ids where params go", lambda: elmo_jax.embed(p, p, o), "swapped"),
        ("an options path", lambda: elmo_jax.embed(p, ids, OPTIONS), "ElmoOptions.from_json"),
        ("token strings", lambda: elmo_jax.embed(p, [["The", "bank"]], o), "batch_to_char_ids"),
        ("one token string", lambda: elmo_jax.embed(p, "The bank", o), "batch_to_char_ids"),
        ("params of another model", lambda: elmo_jax.embed(other.params, ids, o),
         "params do not match the options: char_encoder/char_embed"),
        ("a mix of 4 weights", lambda: elmo_jax.embed(
            p, ids, o, mix={"weights": jnp.zeros((1, 4)), "gamma": jnp.ones(1)}), "3 layers"),
        ("a mix without gamma", lambda: elmo_jax.embed(
            p, ids, o, mix={"weights": jnp.zeros((1, 3))}), "init_mix"),
        ("one token's ids", lambda: elmo_jax.embed(p, ids[0, 0], o), "[batch, tokens, chars]"),
        ("out.mixed without a mix", lambda: elmo_jax.embed(p, ids, o).mixed[0], "mix=init_mix"),
        ("the NNX module with an options path", lambda: elmo_jax.NnxElmoEmbedder(
            OPTIONS, p, rngs=nnx.Rngs(0)), "ElmoOptions.from_json"),
    ]


def test_each_mistake_gets_one_line_that_says_what_to_pass(model):
    for what, call, words in mistakes(model):
        with pytest.raises(ArgumentError) as e:
            call()
        message = str(e.value)
        assert words in message and "\n" not in message, (what, message)
    # and under a user's jit, at trace time
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    with pytest.raises(ArgumentError, match="uint8"):
        jax.jit(lambda x: elmo_jax.embed(model.params, x, model.options).layers)(
            ids.astype(np.uint8))


def test_other_edges_say_what_to_do(model):
    with pytest.raises(TypeError, match=r"wrap its tokens in a list: \[\['The', 'bank'\]\]"):
        elmo_jax.batch_to_char_ids(["The", "bank"])
    # load_weights takes the options file, as AllenNLP's Elmo does
    params = elmo_jax.load_weights(WEIGHTS, OPTIONS)
    np.testing.assert_array_equal(params["char_encoder"]["char_embed"],
                                  model.params["char_encoder"]["char_embed"])
    # a nested list of ids is taken as the array it is
    ids = elmo_jax.batch_to_char_ids(SENTENCES[:1])
    np.testing.assert_allclose(elmo_jax.embed(model.params, ids.tolist(), model.options).layers,
                               elmo_jax.embed(model.params, ids, model.options).layers)


def test_linen_and_nnx_are_deterministic_until_told_to_train(model):
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    want = elmo_jax.embed(model.params, ids, model.options,
                          mix=elmo_jax.init_mix(model.options)).mixed[0]
    nnx_model = elmo_jax.NnxElmoEmbedder(model.options, model.params, rngs=nnx.Rngs(0))
    out = nnx_model(ids)
    assert isinstance(out, elmo_jax.ElmoOutput)
    np.testing.assert_allclose(out.mixed[0], want, atol=1e-6)
    np.testing.assert_allclose(nnx_model(ids).mixed[0], out.mixed[0])  # the same twice
    nnx_model.train()
    dropped = np.asarray(nnx_model(ids).mixed[0]) == 0
    assert 0.3 < dropped[np.asarray(want) != 0].mean() < 0.7
    nnx_model.eval()
    np.testing.assert_allclose(nnx_model(ids).mixed[0], want, atol=1e-6)

    linen = elmo_jax.ElmoEmbedder(model.options, weights=model.params)
    variables = linen.init(jax.random.key(0), ids)
    out = linen.apply(variables, ids)
    assert isinstance(out, elmo_jax.ElmoOutput)
    np.testing.assert_allclose(out.mixed[0], want, atol=1e-6)
    assert type(variables["bilm"]["weights"]) is dict  # plain dicts, as everywhere else
    assert type(variables["bilm"]["weights"]["char_encoder"]) is dict


def test_a_module_without_weights_says_its_bilm_is_random(model):
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    with pytest.warns(UserWarning, match="its biLM is random"):
        elmo_jax.ElmoEmbedder(model.options).init(jax.random.key(0), ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        elmo_jax.ElmoEmbedder(model.options, random_bilm=True).init(jax.random.key(0), ids)


def test_forward_mode_goes_through_jvp_and_matches_finite_differences(model):
    ids = elmo_jax.batch_to_char_ids(SENTENCES[:2])
    params = jax.tree.map(jnp.asarray, model.params)

    def layers(w_h, forward_mode):
        lstm = {**params["lstm"], "layer_0": {**params["lstm"]["layer_0"], "w_h": w_h}}
        return elmo_jax.embed({**params, "lstm": lstm}, ids, model.options,
                              forward_mode=forward_mode).layers

    w = params["lstm"]["layer_0"]["w_h"]
    v = jax.random.normal(jax.random.key(1), w.shape)
    with pytest.raises(TypeError, match="custom_vjp"):  # the documented error of the default
        jax.jvp(lambda w: layers(w, False), (w,), (v,))
    np.testing.assert_array_equal(layers(w, True), layers(w, False))  # the same values
    _, tangent = jax.jvp(lambda w: layers(w, True), (w,), (v,))
    eps = 1e-3
    difference = (layers(w + eps * v, True) - layers(w - eps * v, True)) / (2 * eps)
    np.testing.assert_allclose(tangent, difference, atol=2e-3 * float(jnp.abs(tangent).max()))
    # reverse mode through the plain formulas equals the hand-written backward passes
    grad = lambda fm: jax.grad(lambda w: jnp.sum(layers(w, fm) ** 2))(w)
    np.testing.assert_allclose(grad(True), grad(False), atol=1e-5)


def test_the_shipped_model_is_the_fixture_by_name(model):
    """`bilm-tf-tiny` (in the package, for examples that run anywhere) is the
    fixture bilm-tf trained, weights for weights."""
    shipped = elmo_jax.open_model("bilm-tf-tiny")
    assert shipped.options.network() == model.options.network()
    for a, b in zip(jax.tree.leaves(shipped.params), jax.tree.leaves(model.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="brings its own options"):
        elmo_jax.open_model("bilm-tf-tiny", options=OPTIONS)
