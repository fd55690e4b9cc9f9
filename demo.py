"""Placeholder demo: embed two sentences with the bilm-tf fixture model."""
import os

import numpy as np

import elmo_jax

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "fixtures", "bilm-tf")
elmo = elmo_jax.Elmo.from_files(os.path.join(FIX, "options.json"), os.path.join(FIX, "lm_weights.hdf5"))
a, b = elmo.embed_sentences([["I", "sat", "by", "the", "river", "bank", "."],
                             ["I", "paid", "at", "the", "bank", "."]])
print("layers x tokens x dim:", a.shape, b.shape)
cos = lambda u, v: float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))  # noqa: E731
print("'bank' layer 0 (static) cosine:", round(cos(a[0, 5], b[0, 4]), 4))
print("'bank' layer 2 (contextual) cosine:", round(cos(a[2, 5], b[2, 4]), 4))
