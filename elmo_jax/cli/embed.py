"""Embed text with ELMo: one sentence a line -> an embedding store (a folder)
or bilm-tf's `dump_bilm_embeddings` hdf5 file (a thin shell over
elmo_jax.corpus and elmo_jax.corpus.store). Installed as `elmo-jax embed`; in a
checkout, `python embed.py`.

  elmo-jax embed --input 'corpus/*.txt' --output DIR --model original
      # --model: a registry name (`elmo-jax models`), a URL (a weights file's, with
      # --options its URL, or an archive's), an export folder, a workdir, an
      # ELMoForManyLangs folder; or --weights weights.hdf5 [--options options.json]
      [--layer K | --mix [W0,W1,W2]] [--sentence_vectors] [--dtype float16]
      [--shard I --num_shards N | --distributed] [--compute_dtype bfloat16]
      [--batch_tokens 4096] [--chunk_lines 4096] [--max_length 512]
      [--tokenize [en|zh]] [--on_bad_line skip]
  elmo-jax embed --input sentences.txt --output vectors.hdf5 ...   # bilm-tf's file
  elmo-jax embed --merge DIR --output vectors.hdf5                 # a store as that file

A folder (a path without .hdf5/.h5) is a store, read with
`elmo_jax.open_embeddings(DIR)`: per worker one flat array of vectors plus
offsets, written in chunks that a rerun of the same command keeps (it resumes
a killed or failed run and redoes at most the chunk in flight). Input files
are read in sorted order as one corpus; line i of it is store[i]. With
--shard I --num_shards N (any launcher), or --distributed (a pod's hosts:
each process takes its process index), each worker embeds chunks c with
c % N == I into DIR, with no communication; the store is whole once every
shard is done. Each worker uses every local device.

An .hdf5 path is written whole at the end (through a store beside it, so a
rerun resumes too): dataset str(i) holds line i, [3, n_tokens, 2P] (all
layers), or [n_tokens, 2P] with --layer or --mix; with --sentence_vectors the
mean over the line's tokens ([3, 2P] or [2P]; zeros for a blank line).

Lines end at "\\n" (or "\\r\\n") only, so line i is always entry i; a blank
line is an entry of 0 tokens. Lines are pre-tokenised (split on any Unicode
whitespace, as bilm-tf does) unless --tokenize; a token longer than 48 UTF-8
bytes is spelled by its first 48. A line longer than --max_length tokens is
embedded in overlapping windows (`core.batching.windows`). Stateless: every sentence
starts from a zero state. --stateful carries the state from each line to the
next, as bilm-tf's dump does (an .hdf5 output only, one line at a time).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil

HDF5 = (".hdf5", ".h5")


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", help="UTF-8 text, one sentence a line: a file or a glob "
                    "(quoted), files taken in sorted order")
    ap.add_argument("--output", required=True, help="a store folder, or an .hdf5 file")
    ap.add_argument("--merge", metavar="DIR", help="write the finished store DIR as the "
                    ".hdf5 file --output (bilm-tf's layout)")
    ap.add_argument("--model", help="a registry name, a URL, or a stored model (any form)")
    ap.add_argument("--options", help="options.json or its URL (default: the one beside "
                    "--weights)")
    ap.add_argument("--weights", help="weights hdf5 in bilm-tf's layout, or an export folder")
    ap.add_argument("--workdir", help="a training workdir: use its latest checkpoint")
    ap.add_argument("--tokenize", nargs="?", const="en", choices=("en", "zh"),
                    help="tokenise raw lines: en (Moses, the default) or zh (jieba)")
    ap.add_argument("--layer", type=int, help="store only this layer (0 = token layer)")
    ap.add_argument("--mix", nargs="?", const="", metavar="W0,W1,...",
                    help="store the scalar mix: softmax of these raw weights (default: equal)")
    ap.add_argument("--gamma", type=float, default=1.0, help="scale of --mix")
    ap.add_argument("--sentence_vectors", action="store_true",
                    help="store each line's mean over its tokens (TF-Hub ELMo's `default`)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="the stored dtype (float16 halves the bytes)")
    ap.add_argument("--compute_dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the matmuls' input dtype (bfloat16 on GPUs and TPUs)")
    ap.add_argument("--batch_tokens", type=int, default=4096,
                    help="tokens a batch (rows x length; larger on accelerators)")
    ap.add_argument("--batch_size", type=int,
                    help="at most this many sentences a batch (with --stateful: the batch)")
    ap.add_argument("--chunk_lines", type=int, default=4096,
                    help="lines a chunk: the unit that a rerun keeps")
    ap.add_argument("--max_length", type=int, default=512,
                    help="longer lines are embedded in overlapping windows of this many tokens")
    ap.add_argument("--shard", type=int, help="this worker's shard (with --num_shards)")
    ap.add_argument("--num_shards", type=int, help="the number of workers")
    ap.add_argument("--distributed", action="store_true",
                    help="a multi-host launch: shard = jax.process_index() (the cluster "
                         "from the environment, or --coordinator_address etc.)")
    ap.add_argument("--coordinator_address")
    ap.add_argument("--num_processes", type=int)
    ap.add_argument("--process_id", type=int)
    ap.add_argument("--on_bad_line", default="error", choices=("error", "skip"),
                    help="a line that is not UTF-8: an error naming it, or an empty entry "
                         "recorded in the store's chunk markers")
    ap.add_argument("--stateful", action="store_true",
                    help="carry the LSTM state from line to line (bilm-tf's dump; .hdf5 only)")
    ap.add_argument("--cache_vocab", help="with --stateful: precompute these words' token "
                    "vectors")
    ap.add_argument("--no_progress", action="store_true")
    return ap


def main(argv=None, prog: str = "embed.py"):
    ap = parser(prog)
    args = ap.parse_args(argv)
    from elmo_jax.storage import paths

    for given in (args.input, args.output, args.merge, args.weights, args.options):
        if given and not paths.is_url(given):
            paths.check(given)  # another scheme: one error line, nothing read or written
    to_hdf5 = args.output.endswith(HDF5)
    if args.merge:
        if not to_hdf5:
            ap.error("--merge writes an .hdf5 file: give --output X.hdf5")
        from elmo_jax.corpus.store import merge_to_hdf5

        n = merge_to_hdf5(args.merge, args.output)
        print(json.dumps({"output": args.output, "sentences": n, "merged": args.merge}))
        return
    given = _check_flags(ap, args, to_hdf5)

    import jax

    if args.distributed or args.coordinator_address:
        from elmo_jax.training.pod import initialize

        initialize(args.coordinator_address, args.num_processes, args.process_id)
    from elmo_jax.data.sources import list_shards
    from elmo_jax.formats.stored_model import open_model

    files = list_shards(args.input)
    model = open_model(given[0], options=args.options)
    options = model.options
    mix = None
    if args.mix is not None:
        mix = ([float(w) for w in args.mix.split(",")] if args.mix
               else [0.0] * options.n_output_layers)
    layers = "all" if args.layer is None and mix is None else ("mix" if mix else args.layer)
    if args.stateful:
        n = _stateful(model, files, args, mix)
        print(json.dumps({"output": args.output, "sentences": n, "layers": layers,
                          "sentence_vectors": args.sentence_vectors}))
        return
    from elmo_jax.corpus import embed_corpus, shard_of_process

    settings = _settings(args, mix)
    shard, num_shards = shard_of_process(args.shard, args.num_shards)
    directory = _parts_dir(args.output) if to_hdf5 else args.output
    from elmo_jax.cli.process import use_compilation_cache

    use_compilation_cache()
    guard = contextlib.nullcontext()
    if jax.process_count() > 1:  # one process's error ends every process (pod.py)
        from elmo_jax.training.pod import failures_stop_every_process

        guard = failures_stop_every_process()
    with guard:
        summary = embed_corpus(model.params, options, files, directory, settings, shard,
                               num_shards, model.lexicon, progress=not args.no_progress)
    if to_hdf5:
        from elmo_jax.corpus.store import merge_to_hdf5

        merge_to_hdf5(directory, args.output)
        shutil.rmtree(directory)
        summary["output"] = args.output
    summary.update({"sentences": summary["lines"], "layers": layers,
                    "sentence_vectors": args.sentence_vectors, "dtype": args.dtype})
    print(json.dumps(summary))


def _check_flags(ap, args, to_hdf5: bool) -> list:
    """The flags' combinations, each wrong one an argparse error; returns
    the one model flag given."""
    if not args.input:
        ap.error("give --input (or --merge DIR)")
    given = [a for a in (args.model, args.weights, args.workdir) if a]
    if len(given) != 1 or (args.options and args.workdir):
        ap.error("give --model, or --weights (and --options unless options.json is beside "
                 "it), or --workdir")
    if args.layer is not None and args.mix is not None:
        ap.error("--layer and --mix exclude each other")
    if args.stateful and not to_hdf5:
        ap.error("--stateful carries the state across lines, so its work cannot be split "
                 "into chunks, shards or resumed: write an .hdf5 file (--output X.hdf5)")
    if args.cache_vocab and not args.stateful:
        ap.error("--cache_vocab goes with --stateful: the corpus job runs the character "
                 "CNN on the devices, in the same program as the LSTMs")
    if (args.shard is None) != (args.num_shards is None):
        ap.error("--shard and --num_shards go together")
    if to_hdf5 and (args.num_shards or 1) > 1:
        ap.error("several workers write a store folder (--output DIR), then "
                 "`--merge DIR --output X.hdf5`")
    return given


def _settings(args, mix):
    from elmo_jax.corpus import CorpusSettings

    return CorpusSettings(
        output="mix" if mix else ("layer" if args.layer is not None else "layers"),
        layer=args.layer, mix_weights=tuple(mix) if mix else None, gamma=args.gamma,
        sentence_vectors=args.sentence_vectors, dtype=args.dtype,
        compute_dtype=args.compute_dtype, batch_tokens=args.batch_tokens,
        max_rows=args.batch_size, max_length=args.max_length, chunk_lines=args.chunk_lines,
        tokenize=args.tokenize, on_bad_line=args.on_bad_line)


def _parts_dir(hdf5_path: str) -> str:
    """The store an .hdf5 output is built in (beside it, or in the local cache
    for a file in a bucket; removed once written)."""
    from elmo_jax.storage import copies, paths

    if paths.is_remote(hdf5_path):
        import hashlib

        key = hashlib.sha256(hdf5_path.encode()).hexdigest()[:24]
        return os.path.join(copies.local_cache_root(), "parts", key)
    head, tail = os.path.split(os.path.abspath(hdf5_path))
    return os.path.join(head, f".{tail}.parts")


def _stateful(model, files, args, mix) -> int:
    """bilm-tf's stateful dump: one line at a time, the state carried on."""
    from elmo_jax.data import read_sentences
    from elmo_jax.api.dump import dump_embeddings
    from elmo_jax.api.elmo import Elmo
    from elmo_jax.core.vocab import read_word_list

    sentences = [s for f in files for s in read_sentences(f, keep_empty=True)]
    if args.tokenize:
        from elmo_jax.data.segmentation import tokenize_lines

        sentences = tokenize_lines([" ".join(s) for s in sentences], lang=args.tokenize)
    cache = read_word_list(args.cache_vocab) if args.cache_vocab else None
    elmo = Elmo(model.params, model.options, stateful=True, cache_vocab=cache,
                lexicon=model.lexicon, max_length=args.max_length)
    return dump_embeddings(elmo, sentences, args.output, batch_size=1, layer=args.layer,
                           mix_weights=mix, gamma=args.gamma, progress=not args.no_progress,
                           sentence_vectors=args.sentence_vectors)
