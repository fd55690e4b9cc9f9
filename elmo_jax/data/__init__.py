"""The data pipeline: text -> sentences -> training windows.

    sources.py  reading text files as bilm-tf does, held-out files once in
                order, TFDS's lm1b; vocabularies
    batches.py  `Batcher`: B streams cut in windows of unroll_steps, the batch
                layout (its docstring), the distinct-token tables (evaluation,
                and any iterable of sentences)
    streams.py  training: `TokenCorpus` (text as token ids, `train.py prepare`),
                `StreamBatcher` (batches by array slicing, a global position)
    workers.py  `ParallelStreamBatcher`: the same batches made in worker processes
"""
from elmo_jax.data.batches import Batcher, CharIdCache, pad_tables
from elmo_jax.data.sources import (DataError, OnceSource, list_shards, lm1b_records,
                                   lm1b_sentences, read_sentences, vocab_from_files)
from elmo_jax.data.streams import (StreamBatcher, TableShapes, TokenCorpus, largest_table,
                                   open_corpus, prepare)
from elmo_jax.data.workers import ParallelStreamBatcher

__all__ = ["Batcher", "CharIdCache", "pad_tables", "DataError", "OnceSource", "list_shards",
           "lm1b_records", "lm1b_sentences", "read_sentences", "vocab_from_files",
           "ParallelStreamBatcher", "StreamBatcher", "TableShapes", "TokenCorpus",
           "largest_table", "open_corpus", "prepare"]
