"""The data pipeline: text -> sentences -> training windows.

    sources.py  sentence sources (text shards, held-out files read once, TFDS
                lm1b), resumable; reading files as bilm-tf does; vocabularies
    batches.py  `Batcher`: B streams cut in windows of unroll_steps, the batch
                layout (its docstring), the distinct-token tables
    workers.py  `ParallelBatcher`: the same batches made in worker processes
"""
from elmo_jax.data.batches import Batcher, CharIdCache, pad_tables
from elmo_jax.data.sources import (DataError, IndexedSource, OnceSource, TextSource,
                                   list_shards, lm1b_source, read_sentences, shuffle_key,
                                   vocab_from_files)
from elmo_jax.data.workers import ParallelBatcher

__all__ = ["Batcher", "CharIdCache", "pad_tables", "DataError", "IndexedSource", "OnceSource",
           "TextSource", "list_shards", "lm1b_source", "read_sentences", "shuffle_key",
           "vocab_from_files", "ParallelBatcher"]
