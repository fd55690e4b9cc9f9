"""`embed` against the same equations written once, in float64 numpy, straight
from bilm-tf's weight layout (TF gate order i, j, f, o; forget bias +1 at run
time; [input; h_prev] rows in W_0). Random weights, ragged batch."""
import numpy as np
import pytest

import elmo_jax
from conftest import random_tf_datasets, tiny_options_dict, write_datasets

SENTENCES = [
    ["The", "bank", "of", "the", "river", "."],
    ["Naïve", "café", "—", "日本語", "x" * 60],
    ["a"],
    [],
    ["Light", "plays", "on", "the", "water", "and", "the", "light", "fades", "."],
]


def ref_char_ids(token):
    """bilm-tf's spelling of a token, shifted by +1 (written out independently)."""
    if token in ("<S>", "</S>"):
        ids = [258, 256 if token == "<S>" else 257, 259]
    else:
        ids = [258] + list(token.encode("utf-8")[:48]) + [259]
    ids = ids + [260] * (50 - len(ids))
    return np.array(ids) + 1


def ref_token_vectors(ds, opts, tokens):
    c = opts["char_cnn"]
    table = np.vstack([np.zeros((1, ds["char_embed"].shape[1])), ds["char_embed"]])
    out = []
    for tok in tokens:
        e = table[ref_char_ids(tok)]  # [50, E]
        feats = []
        for i, (w, n) in enumerate(c["filters"]):
            W, b = ds[f"CNN/W_cnn_{i}"][0], ds[f"CNN/b_cnn_{i}"]  # [w, E, n]
            conv = np.stack([np.einsum("ke,ken->n", e[t:t + w], W) + b
                             for t in range(50 - w + 1)])
            feats.append(conv.max(axis=0))
        x = np.concatenate(feats)
        x = np.maximum(x, 0) if c["activation"] == "relu" else np.tanh(x)
        for k in range(c["n_highway"]):
            g = f"CNN_high_{k}"
            gate = 1 / (1 + np.exp(-(x @ ds[f"{g}/W_carry"] + ds[f"{g}/b_carry"])))
            x = gate * np.maximum(x @ ds[f"{g}/W_transform"] + ds[f"{g}/b_transform"], 0) \
                + (1 - gate) * x
        out.append(x @ ds["CNN_proj/W_proj"] + ds["CNN_proj/b_proj"])
    return np.array(out)


def ref_lstm(ds, opts, direction, xs, h0=None, c0=None):
    """One direction, all layers, over xs [T, P]; returns per-layer outputs and final states."""
    lo = opts["lstm"]
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    outputs, finals = [], []
    for layer in range(lo["n_layers"]):
        g = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
        W, B = ds[f"{g}/W_0"], ds[f"{g}/B"]
        WP = ds.get(f"{g}/W_P_0")  # none: bilm-tf's LSTMCell without num_proj
        h = np.zeros(lo["projection_dim"]) if h0 is None else h0[layer]
        c = np.zeros(lo["dim"]) if c0 is None else c0[layer]
        ys = []
        for x in xs:
            i, j, f, o = np.split(np.concatenate([x, h]) @ W + B, 4)
            c = sig(f + 1.0) * c + sig(i) * np.tanh(j)
            c = np.clip(c, -lo["cell_clip"], lo["cell_clip"])
            h = sig(o) * np.tanh(c)
            if WP is not None:
                h = np.clip(h @ WP, -lo["proj_clip"], lo["proj_clip"])
            ys.append(h)
        ys = np.array(ys)
        if lo["use_skip_connections"] and layer > 0:
            ys = ys + xs
        outputs.append(ys)
        finals.append((h, c))
        xs = ys
    return outputs, finals


def ref_elmo(ds, opts, sentence, keep_boundaries=False):
    """[L+1, n, 2P] layers (n + 2 with `keep_boundaries`) and the final (h, c)
    per layer and direction."""
    ds = {k: v.astype(np.float64) for k, v in ds.items()}
    x = ref_token_vectors(ds, opts, ["<S>"] + sentence + ["</S>"])
    fwd, ffin = ref_lstm(ds, opts, 0, x)
    bwd, bfin = ref_lstm(ds, opts, 1, x[::-1])
    layers = [np.concatenate([x, x], -1)] + [np.concatenate([f, b[::-1]], -1)
                                             for f, b in zip(fwd, bwd)]
    layers = np.array(layers)
    return (layers if keep_boundaries else layers[:, 1:-1]), (ffin, bfin)


@pytest.mark.slow
def test_trimmed_spellings_give_the_same_token_vectors_and_gradients(tmp_path):
    """`chars.trim_padding` (what `Elmo` and the training batches feed the
    character CNN): the token vectors still match the float64 reference over all
    50 characters, and every parameter's gradient equals the untrimmed one."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.chars import trim_padding
    from elmo_jax.core.bilm import BiLM

    opts = tiny_options_dict()
    options = elmo_jax.ElmoOptions.from_dict(opts)
    ds = random_tf_datasets(options, seed=5)
    write_datasets(tmp_path / "w.hdf5", ds)
    params = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    tokens = ["The", "bank", "of", "rivers", "café", "日本語", "a", "."]
    elmo = elmo_jax.Elmo(params, options)
    np.testing.assert_allclose(elmo.token_vectors(tokens),
                               ref_token_vectors({k: v.astype(np.float64) for k, v in ds.items()},
                                                 opts, tokens), atol=2e-5, rtol=1e-5)
    ids = elmo_jax.batch_to_char_ids([tokens, tokens[:3]])
    cut = trim_padding(ids, options.char_cnn.widest_filter, multiple=1)
    assert cut.shape[-1] == 14                                  # 日本語: 9 bytes + 2 marks + 3
    probe = np.random.default_rng(0).normal(size=ids.shape[:2] + (8,)).astype(np.float32)

    def grads(char_ids):
        def loss(p):
            x = BiLM(options).apply({"params": p}, char_ids, method=BiLM.encode_tokens)
            return jnp.sum(x * probe)
        return jax.grad(loss)(params)

    full, trimmed = grads(jnp.asarray(ids)), grads(jnp.asarray(cut))
    # cut at the end marks, no padding window is left: the vectors change
    one = elmo_jax.batch_to_char_ids([["a", "."]])
    encode = lambda c: elmo_jax.encode_tokens(params, jnp.asarray(c), options)  # noqa: E731
    assert not np.allclose(encode(one[..., :3]), encode(one), atol=1e-3)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(full), jax.tree.leaves(trimmed)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))
    assert float(jnp.abs(full["char_encoder"]["char_embed"][261]).max()) > 0, \
        "the padding character's embedding gets a gradient (a padding window is a maximum)"


@pytest.mark.parametrize("skip", [True, False])
def test_embed_matches_float64_reference(tmp_path, skip):
    opts = tiny_options_dict(skip=skip)
    options = elmo_jax.ElmoOptions.from_dict(opts)
    ds = random_tf_datasets(options, seed=1 + skip)
    write_datasets(tmp_path / "w.hdf5", ds)
    params = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(SENTENCES), options)
    layers, mask = np.asarray(out.layers), np.asarray(out.mask)
    P = options.lstm.projection_dim
    clipped = 0
    for b, sentence in enumerate(SENTENCES):
        want, (ffin, bfin) = ref_elmo(ds, opts, sentence)
        n = len(sentence)
        np.testing.assert_allclose(layers[:, b, :n], want, atol=2e-5, rtol=1e-5)
        assert not layers[:, b, n:].any(), "padding must be zero"
        assert mask[b].tolist() == [True] * n + [False] * (mask.shape[1] - n)
        for layer in range(options.lstm.n_layers):
            for d, fin in enumerate((ffin, bfin)):
                np.testing.assert_allclose(out.state.h[layer, d, b], fin[layer][0], atol=2e-5)
                np.testing.assert_allclose(out.state.c[layer, d, b], fin[layer][1], atol=2e-5)
        clipped += int(np.sum(np.isclose(np.abs(want[1:, :, :P]), 0.5)))
    assert clipped > 0, "the random weights should make the projection clip bite"


def test_model_without_projection_matches_reference_and_round_trips(tmp_path):
    """lstm.dim == projection_dim: bilm-tf builds no projection and writes no
    W_P_0; such a file loads, embeds as TF's LSTMCell computes, and is written
    back in the same layout."""
    import h5py

    opts = tiny_options_dict(cell_clip=1.0, proj_clip=0.01)  # proj_clip must not apply
    opts["lstm"]["dim"] = opts["lstm"]["projection_dim"]
    options = elmo_jax.ElmoOptions.from_dict(opts)
    ds = random_tf_datasets(options, seed=5)
    assert not any("W_P_0" in k for k in ds)
    write_datasets(tmp_path / "w.hdf5", ds)
    params = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(SENTENCES), options)
    for b, sentence in enumerate(SENTENCES):
        want, _ = ref_elmo(ds, opts, sentence)
        np.testing.assert_allclose(np.asarray(out.layers)[:, b, :len(sentence)], want,
                                   atol=2e-5, rtol=1e-5)
    assert float(np.abs(np.asarray(out.layers[1])).max()) > 0.05  # no projection clip at 0.01
    elmo_jax.save_weights(tmp_path / "back.hdf5", params, options)
    with h5py.File(tmp_path / "back.hdf5") as a, h5py.File(tmp_path / "w.hdf5") as b:
        names = []
        a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
        assert sorted(names) == sorted(ds)
        for n in names:
            np.testing.assert_array_equal(a[n][...], b[n][...])


def test_stateful_continuation_matches_reference(tmp_path):
    """Passing the returned state continues exactly like one long reading."""
    opts = tiny_options_dict()
    options = elmo_jax.ElmoOptions.from_dict(opts)
    ds = random_tf_datasets(options, seed=3)
    write_datasets(tmp_path / "w.hdf5", ds)
    params = elmo_jax.load_weights(tmp_path / "w.hdf5", options)
    first, second = [["one", "two"]], [["three", "four", "five"]]
    out1 = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(first), options)
    out2 = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(second), options, out1.state)

    dsf = {k: v.astype(np.float64) for k, v in ds.items()}
    _, (ffin, bfin) = ref_elmo(ds, opts, first[0])
    x = ref_token_vectors(dsf, opts, ["<S>"] + second[0] + ["</S>"])
    h0 = [f[0] for f in ffin]
    c0 = [f[1] for f in ffin]
    fwd, _ = ref_lstm(dsf, opts, 0, x, h0, c0)
    bwd, _ = ref_lstm(dsf, opts, 1, x[::-1], [f[0] for f in bfin], [f[1] for f in bfin])
    top = np.concatenate([fwd[-1], bwd[-1][::-1]], -1)[1:-1]
    np.testing.assert_allclose(np.asarray(out2.layers[2, 0]), top, atol=2e-5)
    fresh = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(second), options)
    assert np.abs(np.asarray(fresh.layers[2]) - np.asarray(out2.layers[2])).max() > 1e-3


def test_init_params_shapes_match_the_weight_format():
    import jax

    from elmo_jax.formats.weights import expected_shapes, params_to_datasets

    options = elmo_jax.ElmoOptions.from_dict(tiny_options_dict())
    params = elmo_jax.init_params(options, jax.random.PRNGKey(0))
    ds = params_to_datasets(params, options)
    assert {k: v.shape for k, v in ds.items()} == expected_shapes(options)
    assert not np.asarray(params["char_encoder"]["char_embed"][0]).any()


@pytest.mark.parametrize("clips", [(0.4, 0.3), (None, None)])
def test_lstm_scan_backward_equals_autodiff(clips):
    """The hand-written backward pass of lstm_scan against JAX's autodiff of
    a plain scan over lstm_cell: ragged masks, clipping active, carried state."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.kernels import lstm_cell, lstm_scan

    cell_clip, proj_clip = clips
    T, B, P, D = 7, 3, 4, 5
    ks = jax.random.split(jax.random.PRNGKey(0), 8)
    w_h_t = jax.random.normal(ks[0], (2, 4 * D, P))
    w_proj_t = jax.random.normal(ks[1], (2, P, D))
    gx = 2 * jax.random.normal(ks[2], (T, 2, 4 * D, B))  # feature-major
    h0, c0 = jax.random.normal(ks[3], (2, P, B)), jax.random.normal(ks[4], (2, D, B))
    mask = (jnp.arange(T)[:, None] < jnp.array([7, 4, 1])[None, :]).astype(jnp.float32)
    probe_out = jax.random.normal(ks[5], (T, 2, P, B))
    probe_h, probe_c = jax.random.normal(ks[6], (2, P, B)), jax.random.normal(ks[7], (2, D, B))

    def reference(w_h_t, w_proj_t, gx, h0, c0):
        def step(carry, inputs):  # padded rows keep their state and output zeros
            (h, c), (g, m) = carry, inputs
            (h_new, c_new), _ = lstm_cell(w_h_t, w_proj_t, cell_clip, proj_clip, h, c, g)
            m = m[None, None, :].astype(bool)
            return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), jnp.where(m, h_new, 0.0)

        (h, c), out = jax.lax.scan(step, (h0, c0), (gx, mask))
        return out, (h, c)

    def custom(w_h_t, w_proj_t, gx, h0, c0):
        return lstm_scan(cell_clip, proj_clip, 1, w_h_t, w_proj_t, gx, mask, h0, c0)

    def loss(f):
        def value(*args):
            out, (h, c) = f(*args)
            return jnp.sum(out * probe_out) + jnp.sum(h * probe_h) + jnp.sum(c * probe_c)
        return jax.jit(jax.value_and_grad(value, argnums=(0, 1, 2, 3, 4)))

    args = (w_h_t, w_proj_t, gx, h0, c0)
    (v_ref, g_ref), (v, g) = loss(reference)(*args), loss(custom)(*args)
    np.testing.assert_allclose(v, v_ref, rtol=1e-6)
    for name, a, b in zip(["w_h_t", "w_proj_t", "gx", "h0", "c0"], g, g_ref):
        assert float(jnp.abs(b).max()) > 0, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
    if cell_clip is not None:  # the clips were active somewhere
        out, _ = custom(*args)
        assert float(jnp.abs(out).max()) == pytest.approx(proj_clip)


def test_lstm_scan_backward_in_bfloat16_tracks_float32():
    """With bf16 matrices every product of the backward pass (per step and the
    weight gradients after the scan) runs in bf16 with float32 accumulation:
    the gradients stay within bf16 rounding of the float32 ones, in their dtype."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.kernels import lstm_scan

    T, B, P, D = 6, 4, 8, 16
    ks = jax.random.split(jax.random.PRNGKey(1), 5)
    w_h_t = 0.3 * jax.random.normal(ks[0], (2, 4 * D, P))
    w_proj_t = 0.3 * jax.random.normal(ks[1], (2, P, D))
    gx = jax.random.normal(ks[2], (T, 2, 4 * D, B))
    h0, c0 = jax.random.normal(ks[3], (2, P, B)), jax.random.normal(ks[4], (2, D, B))
    mask = (jnp.arange(T)[:, None] < jnp.array([6, 5, 3, 1])[None, :]).astype(jnp.float32)

    def grads(dtype):
        def value(w_h_t, w_proj_t, gx):
            out, (h, c) = lstm_scan(3.0, 3.0, 1, w_h_t.astype(dtype), w_proj_t.astype(dtype),
                                    gx, mask, h0, c0)
            return jnp.sum(out * out) + jnp.sum(c)
        return jax.jit(jax.grad(value, argnums=(0, 1, 2)))(w_h_t, w_proj_t, gx)

    for name, g16, g32 in zip(["w_h_t", "w_proj_t", "gx"], grads(jnp.bfloat16),
                              grads(jnp.float32)):
        assert g16.dtype == jnp.float32, name  # the cast back to the float32 parameters
        err = float(jnp.linalg.norm(g16 - g32) / jnp.linalg.norm(g32))
        assert 0 < err < 0.03, (name, err)


@pytest.mark.parametrize("width", [1, 3, 9])
def test_char_conv_max_and_its_gradients_match_float64_numpy(width):
    """char_conv_max's forward (XLA's convolution, max over positions) and
    hand-written backward (window matrix products, the gradient to each
    maximum's position) against the sums written out in float64 numpy; width 9
    over 9 characters leaves one window."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.kernels import char_conv_max

    N, C, E, F = 5, 9, 4, 6
    L = C - width + 1
    rng = np.random.default_rng(width)
    x, k = rng.normal(size=(N, C, E)), rng.normal(size=(width, E, F))
    probe = rng.normal(size=(N, F))
    y = sum(np.einsum("nle,ef->nlf", x[:, i:i + L], k[i]) for i in range(width))  # [N, L, F]
    top = y.argmax(axis=1)                                                      # [N, F]
    d_k, d_x = np.zeros_like(k), np.zeros_like(x)
    for n in range(N):
        for f in range(F):
            for i in range(width):
                d_k[i, :, f] += x[n, top[n, f] + i] * probe[n, f]
                d_x[n, top[n, f] + i] += k[i, :, f] * probe[n, f]

    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    got = char_conv_max(f32(x), f32(k))
    got_dx, got_dk = jax.grad(lambda x, k: jnp.sum(char_conv_max(x, k) * f32(probe)),
                              argnums=(0, 1))(f32(x), f32(k))
    for got, want in ((got, y.max(axis=1)), (got_dx, d_x), (got_dk, d_k)):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_input_gates_and_gradients_match_references(dtype):
    """input_gates' hand-written gradients against autodiff of the same einsum
    at full float32 precision (on the same, rounded, inputs); with bf16
    operands they come back in bf16, within its rounding."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.core.kernels import input_gates

    ks = jax.random.split(jax.random.PRNGKey(2), 3)
    # x [2, n, T, Pin], w [2, Pin, 4D]; the gates come out [T, 2, 4D, n]
    x, w = jax.random.normal(ks[0], (2, 3, 4, 8)), jax.random.normal(ks[1], (2, 8, 20))
    probe = jax.random.normal(ks[2], (4, 2, 20, 3))
    dt = jnp.dtype(dtype)

    def custom(x, w):
        return jnp.sum(input_gates(x, w) * probe)

    def reference(x, w):
        return jnp.sum(jnp.einsum("dntp,dpg->tdgn", x, w,
                                  precision=jax.lax.Precision.HIGHEST) * probe)

    x32, w32 = x.astype(dt).astype(jnp.float32), w.astype(dt).astype(jnp.float32)
    np.testing.assert_allclose(
        np.asarray(input_gates(x.astype(dt), w.astype(dt))),
        np.einsum("dntp,dpg->tdgn", np.asarray(x32, np.float64), np.asarray(w32, np.float64)),
        rtol=1e-5, atol=1e-5)
    got = jax.grad(custom, argnums=(0, 1))(x.astype(dt), w.astype(dt))
    want = jax.grad(reference, argnums=(0, 1))(x.astype(dt).astype(jnp.float32),
                                               w.astype(dt).astype(jnp.float32))
    tol = 1e-5 if dtype == "float32" else 1e-2
    for a, b in zip(got, want):
        assert a.dtype == dt
        np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=tol,
                                   atol=tol * float(jnp.abs(b).max()))


def test_clip_gradient_passes_at_the_limit_as_tensorflows_clip_by_value():
    """TF's clip_by_value gradient is 0 only outside [-limit, limit] (its
    _ClipByValueGrad selects x < min and x > max): the backward pass's
    derivative of the clips follows it, the limits included."""
    import jax.numpy as jnp

    from elmo_jax.core.kernels import within_clip

    x = jnp.array([-3.5, -3.0, -2.9, 0.0, 2.9, 3.0, 3.5])
    np.testing.assert_array_equal(within_clip(x, 3.0), [0, 1, 1, 1, 1, 1, 0])
    assert within_clip(x, None) == 1.0
