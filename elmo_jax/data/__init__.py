"""The data pipeline: text -> sentences -> training windows.

    sources.py  reading text files as bilm-tf does, TFDS's lm1b; vocabularies
    tokens.py   `TokenCorpus`: text as token ids (`train.py prepare`)
    streams.py  the batch layout (its docstring); `StreamBatcher` (training's
                and evaluation's batches by array slicing, one global position)
    workers.py  `ParallelStreamBatcher`: the same batches made in worker processes
"""
from elmo_jax.data.sources import (DataError, list_shards, lm1b_records,
                                   lm1b_sentences, read_sentences, vocab_from_files)
from elmo_jax.data.streams import (SpellingTables, StreamBatcher, TableShapes, batches_once,
                                   largest_table)
from elmo_jax.data.tokens import TokenCorpus, open_corpus, prepare
from elmo_jax.data.workers import ParallelStreamBatcher

__all__ = ["DataError", "list_shards",
           "lm1b_records", "lm1b_sentences", "read_sentences", "vocab_from_files",
           "ParallelStreamBatcher", "SpellingTables", "StreamBatcher", "TableShapes",
           "TokenCorpus", "batches_once", "largest_table", "open_corpus", "prepare"]
