"""embed as a JAX function (jit, grad, vmap, sharding), the scalar mix, the
notebook wrapper, and bad input."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax
from elmo_jax.core import chars
from conftest import REPO, devices_env, random_tf_datasets, tiny_options_dict, write_datasets
from test_fixtures import _batches, _expected
from test_model import SENTENCES, ref_elmo


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    opts = tiny_options_dict()
    options = elmo_jax.ElmoOptions.from_dict(opts)
    ds = random_tf_datasets(options, seed=5)
    path = tmp_path_factory.mktemp("w") / "w.hdf5"
    write_datasets(path, ds)
    return opts, options, ds, elmo_jax.load_weights(path, options)


@pytest.mark.slow
def test_jit_equals_eager(model):
    _, options, _, params = model
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    jitted = elmo_jax.embed(params, ids, options)
    with jax.disable_jit():
        eager = elmo_jax.embed(params, ids, options)
    np.testing.assert_allclose(np.asarray(jitted.layers), np.asarray(eager.layers), atol=1e-6)
    np.testing.assert_allclose(np.asarray(jitted.state.c), np.asarray(eager.state.c), atol=1e-6)


def test_vmap_over_batches(model):
    _, options, _, params = model
    a = elmo_jax.batch_to_char_ids(SENTENCES[:2], min_length=12)
    b = elmo_jax.batch_to_char_ids(SENTENCES[3:5], min_length=12)
    both = jax.vmap(lambda ids: elmo_jax.embed(params, ids, options).layers)(jnp.stack([a, b]))
    np.testing.assert_allclose(both[0], elmo_jax.embed(params, a, options).layers, atol=1e-6)
    np.testing.assert_allclose(both[1], elmo_jax.embed(params, b, options).layers, atol=1e-6)


def test_grad_through_mix_and_embed_is_finite_and_nonzero(model):
    _, options, _, params = model
    ids = elmo_jax.batch_to_char_ids(SENTENCES)
    mix = elmo_jax.init_mix(options, n_mixes=2)

    def loss(mix, params):
        out = elmo_jax.embed(params, ids, options, mix=mix, mix_layer_norm=True)
        return jnp.sum(out.mixed[0] ** 2) + jnp.sum(jnp.sin(out.mixed[1]))

    g_mix, g_params = jax.jit(jax.grad(loss, argnums=(0, 1)))(mix, params)
    leaves = jax.tree.leaves((g_mix, g_params))
    assert all(bool(jnp.isfinite(x).all()) for x in leaves)
    assert float(jnp.abs(g_mix["weights"]).sum()) > 0
    assert float(jnp.abs(g_params["lstm"]["layer_0"]["w_h"]).sum()) > 0


def _allennlp_scalar_mix(layers, mask, w, gamma, layer_norm):
    """AllenNLP's ScalarMix on layers [K, T, W] with mask [T] (float64)."""
    s = np.exp(w - w.max())
    s = s / s.sum()
    out = 0
    for k, t in enumerate(layers):
        if layer_norm:
            m = mask[:, None]
            n = mask.sum() * t.shape[-1]
            mean = (t * m).sum() / n
            var = (((t * m - mean) * m) ** 2).sum() / n
            t = (t - mean) / np.sqrt(var + 1e-13)
        out = out + s[k] * t
    return gamma * out


@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_matches_allennlp_semantics(model, layer_norm):
    opts, options, ds, params = model
    sentence = SENTENCES[0]
    mix = {"weights": jnp.array([[0.3, -1.0, 0.5]]), "gamma": jnp.array([1.7])}
    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids([sentence]), options, mix=mix,
                         mix_layer_norm=layer_norm)
    full, _ = ref_elmo(ds, opts, sentence, keep_boundaries=True)  # stats include <S>, </S>
    want = _allennlp_scalar_mix(full, np.ones(full.shape[1]), np.array([0.3, -1.0, 0.5]), 1.7,
                                layer_norm)[1:-1]
    np.testing.assert_allclose(np.asarray(out.mixed[0][0]), want, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(out.mix_weights[0]).sum(), 1.0, rtol=1e-6)


def test_wrapper_matches_embed_and_keeps_order(model):
    _, options, _, params = model
    elmo = elmo_jax.Elmo(params, options)
    got = elmo.embed_sentences(SENTENCES, batch_size=2)
    for sentence, arr in zip(SENTENCES, got):
        want = elmo_jax.embed(params, elmo_jax.batch_to_char_ids([sentence]), options).layers[:, 0]
        assert arr.shape == (3, len(sentence), 16)
        np.testing.assert_allclose(arr, np.asarray(want)[:, :len(sentence)], atol=1e-5)


def test_wrapper_buckets_lengths_so_new_inputs_rarely_compile(model):
    from elmo_jax.core.embedding import embed_token_vectors_program as embed_token_vectors
    from elmo_jax.core.embedding import encode_tokens_program as encode_tokens

    _, options, _, params = model
    elmo = elmo_jax.Elmo(params, options, pack=False)
    elmo.embed_sentences([["a"] * 9, ["b"] * 3], batch_size=2)
    compiled = lambda: embed_token_vectors._cache_size() + encode_tokens._cache_size()  # noqa
    before = compiled()
    for n in range(9, 17):  # all lengths 9..16 share the bucket of 16
        elmo.embed_sentences([["w"] * n, ["v"] * 2], batch_size=2)
    assert compiled() == before
    elmo.embed_sentences([["x"] * 17, ["v"] * 2], batch_size=2)  # the next bucket compiles
    assert compiled() == before + 1


def test_packed_wrapper_compiles_a_few_schedules_for_a_corpus(model):
    from elmo_jax.core.embedding import embed_token_vectors_program as embed_token_vectors

    _, options, _, params = model
    rng = np.random.default_rng(0)
    corpus = [["w%d" % k for k in range(int(n))] for n in rng.integers(1, 60, 400)]
    before = embed_token_vectors._cache_size()
    out = elmo_jax.Elmo(params, options).embed_sentences(corpus, batch_size=32)
    assert [a.shape[1] for a in out] == [len(s) for s in corpus]
    assert embed_token_vectors._cache_size() - before <= 8  # 13 batches


def test_cached_vocabulary_path_equals_plain_path(model):
    _, options, _, params = model
    plain = elmo_jax.Elmo(params, options).embed_sentences(SENTENCES)
    vocab = ["The", "bank", "of", "the", "river", ".", "Light", "water"]
    cached = elmo_jax.Elmo(params, options, cache_vocab=vocab)
    assert len(cached._cached) == len(vocab)
    for a, b in zip(plain, cached.embed_sentences(SENTENCES)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_stateful_wrapper_reproduces_the_fixture(fixture_dir):
    elmo = elmo_jax.Elmo.from_files(os.path.join(fixture_dir, "options.json"),
                                    os.path.join(fixture_dir, "lm_weights.hdf5"), stateful=True)
    worst = 0.0
    for i, batch in enumerate(_batches(fixture_dir)):
        for k, arr in enumerate(elmo.embed_sentences(batch, batch_size=3)):
            worst = max(worst, float(np.abs(arr[2] - _expected(fixture_dir, k, i)).max()))
    assert worst <= 2e-6


def test_bad_and_edge_input(model):
    _, options, _, params = model
    with pytest.raises(ValueError, match="empty batch"):
        elmo_jax.embed(params, np.zeros((0, 3, 50), np.int32), options)
    with pytest.raises(ValueError, match="characters per token"):
        elmo_jax.embed(params, np.zeros((1, 3, 60), np.int32), options)
    widest = options.char_cnn.widest_filter
    with pytest.raises(ValueError, match=f"at least the widest filter, {widest}"):
        elmo_jax.embed(params, np.zeros((1, 3, widest - 1), np.int32), options)
    # ids cut by trim_padding (as the README says to) embed exactly like the whole spellings
    ids = elmo_jax.batch_to_char_ids([["a", "cut", "spellings"], ["ok"]])
    cut = chars.trim_padding(ids, widest)
    assert cut.shape[-1] < ids.shape[-1]
    np.testing.assert_array_equal(np.asarray(elmo_jax.embed(params, cut, options).layers),
                                  np.asarray(elmo_jax.embed(params, ids, options).layers))
    with pytest.raises(ValueError, match="state has 4 rows but the batch has 1"):
        elmo_jax.embed(params, elmo_jax.batch_to_char_ids([["a"]]), options,
                       elmo_jax.init_state(options, 4))
    # empty sentences: zero-length results, no error
    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids([[], []]), options)
    assert out.layers.shape == (3, 2, 0, 16)
    assert elmo_jax.Elmo(params, options).embed_sentences([[], ["ok"]])[0].shape == (3, 0, 16)
    assert elmo_jax.Elmo(params, options).embed_sentences([]) == []
    # a 60-byte token and non-ASCII tokens embed like any other
    arr = elmo_jax.Elmo(params, options).embed_sentences([["ü" * 30, "数据", "x" * 60]])[0]
    assert arr.shape == (3, 3, 16) and np.isfinite(arr).all()


SHARDED = textwrap.dedent("""
    import os, sys, numpy as np, jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    sys.path.insert(0, {tests!r})
    import elmo_jax
    from conftest import tiny_options_dict
    options = elmo_jax.ElmoOptions.from_dict(tiny_options_dict())
    params = elmo_jax.init_params(options, jax.random.PRNGKey(0))
    sents = [["w%d" % i] * (1 + i % 5) for i in range(8)]
    ids = elmo_jax.batch_to_char_ids(sents)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded_ids = jax.device_put(ids, NamedSharding(mesh, P("data")))
    out = jax.jit(lambda p, x: elmo_jax.embed(p, x, options).layers)(params, sharded_ids)
    assert len(out.sharding.device_set) == 4, out.sharding
    ref = elmo_jax.embed(params, ids, options).layers
    print("maxdiff", float(np.abs(np.asarray(out) - np.asarray(ref)).max()))
""")


@pytest.mark.slow
def test_sharded_jit_over_four_cpu_devices():
    env = devices_env(4)
    r = subprocess.run([sys.executable, "-c", SHARDED.format(tests=os.path.join(REPO, "tests"))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    diff = float(r.stdout.split("maxdiff")[1])
    assert diff < 1e-5


def test_packed_lstm_equals_unpacked(model):
    """Rows sorted by length: the packed schedule skips padding, same numbers."""
    from elmo_jax.core.embedding import embed_token_vectors, encode_tokens
    from elmo_jax.core.bilm import packed_segments

    _, options, _, params = model
    sents = sorted([["w%d" % (i * j % 7) for j in range(n)] for i, n in
                    enumerate([1, 3, 19, 5, 12, 0, 9, 30, 2, 7, 16])], key=len, reverse=True)
    ids = elmo_jax.batch_to_char_ids(sents, min_length=30)
    tokens, mask = encode_tokens(params, ids, options), ids.any(-1)
    segments = packed_segments(mask.sum(1) + 2, quantum=4)
    assert len(segments) > 1 and segments[-1][2] < len(sents)
    plain = embed_token_vectors(params, tokens, mask, options)
    packed = embed_token_vectors(params, tokens, mask, options, segments=segments)
    np.testing.assert_allclose(np.asarray(packed.layers), np.asarray(plain.layers), atol=1e-5)
    np.testing.assert_allclose(np.asarray(packed.state.c), np.asarray(plain.state.c), atol=1e-5)
    with pytest.raises(ValueError, match="sorted by length"):
        packed_segments([3, 5])


def test_two_options_files_of_one_network_share_one_compiled_embed(model, tmp_path):
    """The jit key is the network (and a canonical dtype), not bilm-tf's
    training fields: options that differ in batch_size, n_epochs, dropout
    and n_characters 261/262 compile `embed` once, as do dtype "bfloat16" and
    jnp.bfloat16; options.json still round-trips field for field."""
    import dataclasses
    import json

    from elmo_jax.core import embedding

    _, options, _, params = model
    other = options.replace(batch_size=options.batch_size + 1, n_epochs=3, dropout=0.3,
                            n_train_tokens=12345, char_cnn=dataclasses.replace(
                                options.char_cnn, n_characters=261))
    ids = jnp.asarray(elmo_jax.batch_to_char_ids([["a", "b"], ["c"]]))
    compiled = lambda: embedding.embed_program._cache_size()  # noqa: E731
    a = elmo_jax.embed(params, ids, options, dtype=jnp.bfloat16)
    before = compiled()
    b = elmo_jax.embed(params, ids, other, dtype="bfloat16")
    assert compiled() == before
    np.testing.assert_array_equal(np.asarray(a.layers), np.asarray(b.layers))
    elmo_jax.embed(params, ids, options.replace(lstm=dataclasses.replace(
        options.lstm, cell_clip=(options.lstm.cell_clip or 1.0) * 2)))
    assert compiled() == before + 1  # another network: its own program
    path = tmp_path / "options.json"
    other.to_json(path)
    assert json.loads(path.read_text()) == other.to_dict()
    assert elmo_jax.ElmoOptions.from_json(path) == other

