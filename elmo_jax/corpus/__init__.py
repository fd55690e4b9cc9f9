"""Embed a corpus into a store (`store.py`): ELMo's feature-based use, built as
a batch-inference job (`elmo-jax embed --input 'corpus/*.txt' --output DIR`).

    lines of the input files, read as they go (memory bounded by one chunk)
      -> chunks of `chunk_lines` lines; chunk c is shard c % num_shards's
         (a worker does only its own, and skips the ones already finished)
      -> pieces (a line, or a window of a line longer than max_length),
         sorted by length within the chunk, batched into a few fixed
         (rows, length) shapes compiled before the first batch
      -> a reader thread spells each batch and places it on the devices
         ahead (rows split over every local device); the main thread
         dispatches one program, character ids to the stored rows
         (`corpus_program`); a writer thread reads the results back and
         appends them, publishing each chunk with its marker.

Every result of a chunk depends only on the chunk's lines, so a resumed run,
a run over other workers or over other devices writes the same rows.

The stages, each a module: `settings` (the flags, the store's spec),
`reading` (lines in chunks), `planning` (pieces, batch shapes, spelling),
`program` (the device program), `writing` (chunks gathered and published),
`job` (`embed_corpus`: the stages joined by threads).
"""
from elmo_jax.corpus.job import embed_corpus, shard_of_process
from elmo_jax.corpus.planning import Piece, Speller, batch_shapes, pieces_of, plan_batches
from elmo_jax.corpus.program import Programs, corpus_program
from elmo_jax.corpus.reading import Chunk, read_chunks
from elmo_jax.corpus.settings import CorpusSettings, describe_inputs, model_fingerprint, store_spec

__all__ = ["embed_corpus", "shard_of_process", "Piece", "Speller", "batch_shapes", "pieces_of",
           "plan_batches", "Programs", "corpus_program", "Chunk", "read_chunks",
           "CorpusSettings", "describe_inputs", "model_fingerprint", "store_spec"]
