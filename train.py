"""Pretrain, evaluate and export an ELMo biLM (a thin shell over elmo_jax.training).

  python train.py --config configs/tiny.json --train_files 'data/*.txt' \\
      --vocab_file vocab.txt --workdir runs/tiny [--eval_files GLOB] [--max_steps N] \\
      [--init_from WEIGHTS_HDF5_OR_WORKDIR]
  python train.py export --workdir runs/tiny --out runs/tiny/export
  python train.py eval   --workdir runs/tiny --eval_files 'heldout/*.txt'
  python train.py vocab  --train_files 'data/*.txt' --out vocab.txt [--max_vocab N] [--min_count N]

Rerunning the same training command resumes from the latest checkpoint in
--workdir. SIGTERM or Ctrl-C saves a checkpoint and stops.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def _train(argv):
    ap = argparse.ArgumentParser(prog="train.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="configs/NAME.json")
    ap.add_argument("--train_files", help="glob of sentence-per-line text files (not with --source lm1b)")
    ap.add_argument("--vocab_file", required=True, help="bilm-tf vocabulary (see `train.py vocab`)")
    ap.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, run.json")
    ap.add_argument("--eval_files", help="glob of held-out files for perplexity")
    ap.add_argument("--max_steps", type=int)
    ap.add_argument("--max_seconds", type=float, help="stop (and checkpoint) after this long")
    ap.add_argument("--init_from", help="fine-tune: a weights.hdf5 (options.json beside it) "
                                        "or a training workdir")
    ap.add_argument("--batch_size", type=int, help="override the config's batch_size")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--eval_every", type=int)
    ap.add_argument("--checkpoint_every", type=int)
    ap.add_argument("--log_every", type=int)
    ap.add_argument("--source", choices=["text", "lm1b"], default="text",
                    help="lm1b: TensorFlow Datasets' One Billion Word Benchmark")
    ap.add_argument("--distributed", action="store_true",
                    help="multi-host: call jax.distributed.initialize() (reads the cluster "
                         "from the environment, or --coordinator_address etc.)")
    ap.add_argument("--coordinator_address")
    ap.add_argument("--num_processes", type=int)
    ap.add_argument("--process_id", type=int)
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)

    import jax

    if args.distributed or args.coordinator_address:
        jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    from elmo_jax import data, training

    options, config = training.load_config(args.config)
    overrides = {k: getattr(args, k) for k in ("max_steps", "max_seconds", "seed", "eval_every",
                                               "checkpoint_every", "log_every")
                 if getattr(args, k) is not None}
    config = dataclasses.replace(config, **overrides)
    if args.batch_size:
        options = options.replace(batch_size=args.batch_size)
    source = None
    if args.source == "text" and not args.train_files:
        ap.error("--train_files is required (or --source lm1b)")
    if args.source == "lm1b":
        source = data.lm1b_source("train", seed=config.seed, process_index=jax.process_index(),
                                  process_count=jax.process_count())
    last = training.train(options, config, args.train_files, args.vocab_file, args.workdir,
                          eval_files=args.eval_files, init_from=args.init_from,
                          progress=not args.no_progress, source=source)
    print(json.dumps(last))


def _export(argv):
    ap = argparse.ArgumentParser(prog="train.py export")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True, help="directory for options.json + weights.hdf5")
    args = ap.parse_args(argv)
    from elmo_jax import training

    print(json.dumps(training.export(args.workdir, args.out)))


def _eval(argv):
    ap = argparse.ArgumentParser(prog="train.py eval")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--eval_files", required=True)
    args = ap.parse_args(argv)
    from elmo_jax import training

    print(json.dumps(training.evaluate_workdir(args.workdir, args.eval_files)))


def _vocab(argv):
    ap = argparse.ArgumentParser(prog="train.py vocab")
    ap.add_argument("--train_files", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max_vocab", type=int, help="entries in all, the 3 specials included")
    ap.add_argument("--min_count", type=int, default=1)
    args = ap.parse_args(argv)
    from elmo_jax import data, vocab

    counts = vocab.count_tokens(s for p in data.list_shards(args.train_files)
                                for s in data.read_sentences(p))
    v = vocab.build_vocab(counts, args.max_vocab, args.min_count)
    v.to_file(args.out)
    covered = sum(counts[w] for w in v.words[3:])
    print(json.dumps({"out": args.out, "size": len(v), "tokens": sum(counts.values()),
                      "coverage": round(covered / max(1, sum(counts.values())), 4)}))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"export": _export, "eval": _eval, "vocab": _vocab}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return _train(argv)


if __name__ == "__main__":
    from elmo_jax.cli import run_cli

    run_cli(main)
