"""The proof that the model is right: reproduce what bilm-tf computed.

Protocol (tests/fixtures/bilm-tf/README.md): batch i = [s[0][i], s[1][i], s[2][i]],
10 batches in order through one stateful biLM, state carried per row from
zeros; expected = top layer, boundaries removed, within 2e-6."""
import json
import os

import h5py
import numpy as np

import elmo_jax


def _batches(fixture_dir):
    with open(os.path.join(fixture_dir, "lm_embeddings_sentences.json")) as fh:
        s = json.load(fh)
    return [[s[k][i].strip().split() for k in range(3)] for i in range(len(s[0]))]


def _expected(fixture_dir, k, i):
    with h5py.File(os.path.join(fixture_dir, f"lm_embeddings_{k}.hdf5"), "r") as fh:
        e = fh[str(i)][...]
    return np.concatenate([e[0], e[1]], axis=-1)  # (T, 2P)


def _run(fixture_dir, stateful):
    options = elmo_jax.ElmoOptions.from_json(os.path.join(fixture_dir, "options.json"))
    params = elmo_jax.load_weights(os.path.join(fixture_dir, "lm_weights.hdf5"), options)
    state, errors = None, []
    for i, batch in enumerate(_batches(fixture_dir)):
        out = elmo_jax.embed(params, elmo_jax.batch_to_char_ids(batch), options,
                             state if stateful else None)
        state = out.state
        for k, sentence in enumerate(batch):
            got = np.asarray(out.layers[2, k, :len(sentence)])
            errors.append(np.abs(got - _expected(fixture_dir, k, i)).max())
    return max(errors)


def test_reproduces_bilm_tf_outputs(fixture_dir):
    assert _run(fixture_dir, stateful=True) <= 2e-6


def test_protocol_matters_state_must_be_carried(fixture_dir):
    # The fixture can tell a stateless run from the stateful one it was made with.
    assert _run(fixture_dir, stateful=False) > 0.1
