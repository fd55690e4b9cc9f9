"""The One Billion Word Benchmark through TensorFlow Datasets.

TFDS prepares lm1b by downloading it from statmt.org, which is the open web:
this recipe never downloads. It reports whether TFDS already has the dataset
prepared (in array_record format, for `tfds.data_source`) in its data dir, and
otherwise says what to do on a machine whose network allows it. Train on it
with `python train.py --source lm1b ...` (its sentences become token ids in
memory at every start), or prepare it once: `python train.py prepare --source
lm1b --out DIR`, then `--train_files DIR`.
"""
from __future__ import annotations

from elmo_jax.data import DataError, lm1b_records
from elmo_jax.data.recipes import common


def prepare(cache_dir: str | None = None, data_dir: str | None = None) -> dict:
    del cache_dir  # TFDS keeps its own data dir
    try:
        records = lm1b_records("train", data_dir=data_dir)
    except DataError as e:
        raise common.RecipeError(
            f"{e}. This recipe does not download from the open web. On a machine with network "
            "access run: python -c \"import tensorflow_datasets as tfds; "
            "tfds.builder('lm1b').download_and_prepare(file_format='array_record')\" (needs "
            "tensorflow), then copy the data dir here.") from None
    return {"recipe": "lm1b", "source": "tfds lm1b", "train_sentences": len(records)}
