"""Embed a text file with ELMo: one sentence a line -> an hdf5 file in
bilm-tf's `dump_bilm_embeddings` layout (a thin shell over elmo_jax.embedding).
Installed as `elmo-jax embed`; in a checkout, `python embed.py`.

  python embed.py --input sentences.txt --output embeddings.hdf5 --model original
      # --model: a registry name (`elmo-jax models`), a URL (a weights file's, with
      # --options its URL, or an archive's), an export folder, a workdir, an
      # ELMoForManyLangs folder; or --weights weights.hdf5 [--options options.json]
      [--tokenize [en|zh]] [--batch_size 64] [--stateful] [--layer K | --mix [W0,W1,W2]]
      [--sentence_vectors] [--max_length 512] [--cache_vocab vocab.txt]

Key str(i) holds line i: float32 [3, n_tokens, 2P] (all layers), or [n_tokens, 2P]
with --layer or --mix; with --sentence_vectors, the mean over the line's tokens
of that ([3, 2P] or [2P]; zeros for a blank line). A line longer than
--max_length tokens is embedded in overlapping windows (`elmo.windows`). Lines end at "\n" (or "\r\n") only, so line i is always
entry i; a blank line is an entry of 0 tokens. Lines are pre-tokenised (split
on any Unicode whitespace, as bilm-tf does) unless --tokenize; a token longer
than 48 UTF-8 bytes is spelled by its first 48. Stateless by default: every sentence starts from a zero state.
--stateful carries the state from each line to the next, as bilm-tf's dump does.
"""
from __future__ import annotations

import argparse
import json


def main(argv=None, prog: str = "embed.py"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="UTF-8 text, one sentence a line")
    ap.add_argument("--output", required=True, help="hdf5 file to write")
    ap.add_argument("--model", help="a registry name, a URL, or a stored model (any form)")
    ap.add_argument("--options", help="options.json or its URL (default: the one beside "
                    "--weights)")
    ap.add_argument("--weights", help="weights hdf5 in bilm-tf's layout, or an export folder")
    ap.add_argument("--workdir", help="a training workdir: use its latest checkpoint")
    ap.add_argument("--tokenize", nargs="?", const="en", choices=("en", "zh"),
                    help="tokenise raw lines: en (Moses, the default) or zh (jieba)")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--stateful", action="store_true",
                    help="carry the LSTM state from line to line (bilm-tf's dump)")
    ap.add_argument("--layer", type=int, help="write only this layer (0 = token layer)")
    ap.add_argument("--mix", nargs="?", const="", metavar="W0,W1,...",
                    help="write the scalar mix: softmax of these raw weights (default: equal)")
    ap.add_argument("--gamma", type=float, default=1.0, help="scale of --mix")
    ap.add_argument("--sentence_vectors", action="store_true",
                    help="write each line's mean over its tokens (TF-Hub ELMo's `default`)")
    ap.add_argument("--max_length", type=int, default=512,
                    help="longer lines are embedded in overlapping windows of this many tokens")
    ap.add_argument("--cache_vocab", help="vocabulary file: precompute these words' token vectors")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    given = [a for a in (args.model, args.weights, args.workdir) if a]
    if len(given) != 1 or (args.options and args.workdir):
        ap.error("give --model, or --weights (and --options unless options.json is beside "
                 "it), or --workdir")
    if args.layer is not None and args.mix is not None:
        ap.error("--layer and --mix exclude each other")

    from elmo_jax.data import read_sentences
    from elmo_jax.dump import dump_embeddings
    from elmo_jax.elmo import Elmo
    from elmo_jax.stored import open_model
    from elmo_jax.vocab import read_word_list

    model = open_model(given[0], options=args.options)
    options, params = model.options, model.params
    sentences = read_sentences(args.input, keep_empty=True)
    if args.tokenize:
        from elmo_jax.segmentation import tokenize_lines

        sentences = tokenize_lines([" ".join(s) for s in sentences], lang=args.tokenize)
    cache = read_word_list(args.cache_vocab) if args.cache_vocab else None
    elmo = Elmo(params, options, stateful=args.stateful, cache_vocab=cache,
                lexicon=model.lexicon, max_length=args.max_length)
    mix = None
    if args.mix is not None:
        mix = ([float(w) for w in args.mix.split(",")] if args.mix
               else [0.0] * options.n_output_layers)
    n = dump_embeddings(elmo, sentences, args.output, batch_size=1 if args.stateful
                        else args.batch_size, layer=args.layer, mix_weights=mix,
                        gamma=args.gamma, progress=not args.no_progress,
                        sentence_vectors=args.sentence_vectors)
    print(json.dumps({"output": args.output, "sentences": n,
                      "layers": "all" if args.layer is None and mix is None
                      else ("mix" if mix else args.layer),
                      "sentence_vectors": args.sentence_vectors}))

