"""A second independent reference: AllenNLP's own outputs for a model with skip
connections on (the published models' setting; the bilm-tf fixture has them
off). See tests/fixtures/allennlp-tiny/README.md."""
import dataclasses
import json
import os

import jax
import numpy as np

import elmo_jax
from conftest import HERE

D = os.path.join(HERE, "fixtures", "allennlp-tiny")


def _max_error(options):
    params = elmo_jax.load_weights(os.path.join(D, "lm_weights.hdf5"), options)
    ref = np.load(os.path.join(D, "reference.npz"))
    state, worst, biggest = None, 0.0, 0.0
    for i in range(int(ref["n_batches"])):
        sentences = json.loads(str(ref[f"tokens_{i}"]))
        ids = elmo_jax.batch_to_char_ids(sentences)
        np.testing.assert_array_equal(ids, ref[f"ids_{i}"])
        if state is not None:  # rows beyond a smaller batch keep their state
            state = jax.tree.map(lambda s: s[:, :, :len(sentences)], state)
        out = elmo_jax.embed(params, ids, options, state)
        state = out.state
        for b, s in enumerate(sentences):
            for layer in range(options.n_output_layers):
                want = ref[f"act{layer}_{i}"][b, 1:len(s) + 1]
                worst = max(worst, float(np.abs(np.asarray(out.layers[layer, b, :len(s)]) - want).max()))
                biggest = max(biggest, float(np.abs(want).max()))
    return worst, biggest


def test_all_layers_match_allennlp_with_skip_connections():
    options = elmo_jax.ElmoOptions.from_json(os.path.join(D, "options.json"))
    assert options.lstm.use_skip_connections
    worst, biggest = _max_error(options)
    assert worst <= 2e-5 and biggest > 1.0, (worst, biggest)


def test_the_reference_tells_the_residual_apart():
    options = elmo_jax.ElmoOptions.from_json(os.path.join(D, "options.json"))
    flipped = options.replace(lstm=dataclasses.replace(options.lstm, use_skip_connections=False))
    assert _max_error(flipped)[0] > 0.1
