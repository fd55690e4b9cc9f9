"""Embed a text file with ELMo: one sentence a line -> an hdf5 file in
bilm-tf's `dump_bilm_embeddings` layout (a thin shell over elmo_jax.embedding).
Installed as `elmo-jax embed`; in a checkout, `python embed.py`.

  python embed.py --input sentences.txt --output embeddings.hdf5 \\
      --options options.json --weights weights.hdf5      # or: --workdir runs/tiny
      [--tokenize] [--batch_size 64] [--stateful] [--layer K | --mix [W0,W1,W2]]
      [--cache_vocab vocab.txt]

Key str(i) holds line i: float32 [3, n_tokens, 2P] (all layers), or [n_tokens, 2P]
with --layer or --mix. Lines end at "\n" (or "\r\n") only, so line i is always
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
    ap.add_argument("--options", help="options.json (default: the one beside --weights)")
    ap.add_argument("--weights", help="weights hdf5 in bilm-tf's layout, or an export folder")
    ap.add_argument("--workdir", help="a training workdir: use its latest checkpoint")
    ap.add_argument("--tokenize", action="store_true", help="Moses-tokenise raw lines")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--stateful", action="store_true",
                    help="carry the LSTM state from line to line (bilm-tf's dump)")
    ap.add_argument("--layer", type=int, help="write only this layer (0 = token layer)")
    ap.add_argument("--mix", nargs="?", const="", metavar="W0,W1,...",
                    help="write the scalar mix: softmax of these raw weights (default: equal)")
    ap.add_argument("--gamma", type=float, default=1.0, help="scale of --mix")
    ap.add_argument("--cache_vocab", help="vocabulary file: precompute these words' token vectors")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    if bool(args.weights) == bool(args.workdir) or (args.options and not args.weights):
        ap.error("give --weights (and --options unless options.json is beside it), or --workdir")
    if args.layer is not None and args.mix is not None:
        ap.error("--layer and --mix exclude each other")

    from elmo_jax.data import read_sentences
    from elmo_jax.dump import dump_embeddings
    from elmo_jax.elmo import Elmo
    from elmo_jax.stored import open_model
    from elmo_jax.vocab import read_word_list

    model = open_model(args.workdir or args.weights, options=args.options)
    options, params = model.options, model.params
    sentences = read_sentences(args.input, keep_empty=True)
    if args.tokenize:
        from elmo_jax.datasets.common import Tokenizer

        tok = Tokenizer()
        sentences = [tok.words(" ".join(s)) for s in sentences]
    cache = read_word_list(args.cache_vocab) if args.cache_vocab else None
    elmo = Elmo(params, options, stateful=args.stateful, cache_vocab=cache)
    mix = None
    if args.mix is not None:
        mix = ([float(w) for w in args.mix.split(",")] if args.mix
               else [0.0] * options.n_output_layers)
    n = dump_embeddings(elmo, sentences, args.output, batch_size=1 if args.stateful
                        else args.batch_size, layer=args.layer, mix_weights=mix,
                        gamma=args.gamma, progress=not args.no_progress)
    print(json.dumps({"output": args.output, "sentences": n,
                      "layers": "all" if args.layer is None and mix is None
                      else ("mix" if mix else args.layer)}))

