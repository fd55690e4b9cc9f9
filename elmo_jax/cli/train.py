"""Pretrain, evaluate, export and score with an ELMo biLM, count a
vocabulary, prepare a corpus, plan a pod (a thin shell over elmo_jax.training,
elmo_jax.data and elmo_jax.api.scoring). Installed as `elmo-jax
train|eval|export|vocab|prepare|score|plan`; in a checkout, `python train.py ...`.

  python train.py --config configs/tiny.json --train_files 'data/*.txt' \\
      --vocab_file vocab.txt --workdir runs/tiny [--eval_files GLOB] [--max_steps N] \\
      [--init_from WEIGHTS_HDF5_OR_EXPORT_OR_WORKDIR] [--set train.learning_rate=0.1 ...]
  python train.py export --workdir runs/tiny --out runs/tiny/export
  python train.py eval   --workdir runs/tiny --eval_files 'heldout/*.txt'
  python train.py vocab  --train_files 'data/*.txt' --out vocab.txt [--max_vocab N] [--min_count N]
  python train.py prepare --train_files 'data/*.txt' --out data/ids  # then --train_files data/ids
  python train.py score  --model runs/tiny/export --input sentences.txt --output scores.jsonl
  python train.py plan   --config original --vocab_size 793471 --mesh data=8,model=8
  python train.py plan   --config original --vocab_size 793471 --target v5e-8 --mesh model=8

A run is one config file (model, train, data; see elmo_jax/config.py); `--set
PATH=VALUE` overrides any field, and the flags below are shorthands for the
common ones. The workdir keeps the resolved config (config.json). Rerunning the
same training command resumes from the latest checkpoint in --workdir. SIGTERM
or Ctrl-C saves a checkpoint and stops.
"""
from __future__ import annotations

import argparse
import json
import sys

from elmo_jax import environment

# flag -> config path: the flags users already type, as shorthands for --set
# (each flag's help and type are the config field's: `config.field_help`)
SHORTHANDS = {
    "train_files": "data.train_files", "vocab_file": "data.vocab_file",
    "eval_files": "data.eval_files", "init_from": "data.init_from", "source": "data.source",
    "tokenize": "data.tokenize", "max_steps": "train.max_steps",
    "max_seconds": "train.max_seconds", "seed": "train.seed", "eval_every": "train.eval_every",
    "checkpoint_every": "train.checkpoint_every", "log_every": "train.log_every",
    "profile_steps": "train.profile_steps", "batch_size": "model.batch_size",
}


def _train(argv, prog):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True,
                    help="configs/NAME.json (or a bilm-tf options.json on its own)")
    ap.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, config.json")
    from elmo_jax.config import HEARTBEAT_TIMEOUT, WAIT_FOR_PEERS, field_help  # no jax

    for flag, path in SHORTHANDS.items():
        meaning, parse = field_help(path)
        ap.add_argument(f"--{flag}", type=parse,
                        choices=["text", "lm1b"] if flag == "source" else None,
                        help=f"{meaning} (= --set {path}=...)")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                    help="override any config field, e.g. train.learning_rate=0.1 or "
                         "model.lstm.dim=512 (repeatable)")
    ap.add_argument("--distributed", action="store_true",
                    help="multi-host: call jax.distributed.initialize() (reads the cluster "
                         "from the environment, or --coordinator_address etc.)")
    ap.add_argument("--coordinator_address")
    ap.add_argument("--num_processes", type=int)
    ap.add_argument("--process_id", type=int)
    ap.add_argument("--heartbeat_timeout", type=float, default=HEARTBEAT_TIMEOUT,
                    help="several processes: seconds a silent peer (stalled, its host gone) is "
                         f"waited for before every other process stops with an error (default "
                         f"{HEARTBEAT_TIMEOUT:g}; longer than the slowest checkpoint save or "
                         "compile's pause)")
    ap.add_argument("--wait_for_peers", type=float, default=WAIT_FOR_PEERS,
                    help="several processes: seconds to wait at start for every process to "
                         f"join (default {WAIT_FOR_PEERS:g}), saying so every 30 s")
    ap.add_argument("--per_device_batch", type=int,
                    help="rows per device, as bilm-tf's batch_size (per GPU): the global "
                         "model.batch_size becomes this times every device of the run")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    if args.per_device_batch is not None and args.batch_size is not None:
        ap.error("--batch_size (global) and --per_device_batch: give one")

    several = args.distributed or args.coordinator_address
    if several and not environment.supervised():
        from elmo_jax.cli.supervise import supervise

        # jax can end a process from C++; its parent then says why in one line
        sys.exit(supervise(list(argv), f"process {args.process_id} of {args.num_processes}"))
    import jax

    from elmo_jax.training.stopping import catch_signals_now, early_signal, keep_signal

    catch_signals_now()  # a notice during start-up stops the run before step 1
    if several:
        from elmo_jax.training.pod import initialize

        late = initialize(args.coordinator_address, args.num_processes, args.process_id,
                          args.heartbeat_timeout, args.wait_for_peers, keep_a_signal=True,
                          kept=early_signal())
        if late:
            keep_signal(late)  # for the stop before step 1
        catch_signals_now()  # back from jax's preemption notifier
    from elmo_jax.config import load_config
    from elmo_jax.training import train_and_evaluate

    overrides = [f"{path}={json.dumps(getattr(args, flag))}"
                 for flag, path in SHORTHANDS.items() if getattr(args, flag) is not None]
    if args.per_device_batch is not None:
        overrides.append(f"model.batch_size={args.per_device_batch * jax.device_count()}")
    config = load_config(args.config, args.set + overrides)
    from elmo_jax.storage import clients, paths

    from elmo_jax import private_apis
    from elmo_jax.cli.process import use_compilation_cache

    use_compilation_cache()
    if paths.is_remote(args.workdir):  # a save waits out a bucket's outage this long at most
        private_apis.bound_storage_retries(clients.retry_seconds())
    last = train_and_evaluate(config, args.workdir, progress=not args.no_progress)
    print(json.dumps(last))
    if several:
        from elmo_jax.training.pod import finish_together

        finish_together()


def _export(argv, prog):
    ap = argparse.ArgumentParser(
        prog=prog, description="Write a model as an artifact other stacks load: bilm-tf's "
        "format (AllenNLP and bilm-tf read it), a TF2 SavedModel with TF-Hub ELMo's "
        "signatures, or a jax.export program (docs/guides/serving.md).")
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="what open_model opens: a published name, an export "
                       "folder, a weights file, a training workdir, an ELMoForManyLangs "
                       "folder; local or gs:// / s3://")
    model.add_argument("--workdir", help="a training run (the same as --model)")
    from elmo_jax.formats.serving import FORMATS

    ap.add_argument("--format", default="bilm-tf", choices=FORMATS,
                    help="bilm-tf: options.json + weights.hdf5 + vocab.txt + softmax.hdf5; "
                    "savedmodel: TF-Hub ELMo's interface; jax: embed.jaxexport + weights.npz")
    ap.add_argument("--out", required=True,
                    help="a new or empty folder (local or in a bucket), written whole")
    ap.add_argument("--options", help="the options.json of a weights file")
    ap.add_argument("--trainable-bilm", action="store_true",
                    help="savedmodel: the biLM's weights train too (else only the mix)")
    args = ap.parse_args(argv)
    from elmo_jax.formats.serving import export_model

    print(json.dumps(export_model(args.model or args.workdir, args.out, args.format,
                                  trainable_bilm=args.trainable_bilm, options=args.options)))


def _eval(argv, prog):
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--eval_files", required=True)
    args = ap.parse_args(argv)
    from elmo_jax.training import evaluate_workdir

    print(json.dumps(evaluate_workdir(args.workdir, args.eval_files)))


def _vocab(argv, prog):
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--train_files", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max_vocab", type=int, help="entries in all, the 3 specials included")
    ap.add_argument("--min_count", type=int, default=1)
    ap.add_argument("--tokenize", choices=("en", "zh"),
                    help="raw lines: tokenise (Moses) or segment Chinese (jieba) first, cached")
    args = ap.parse_args(argv)
    from elmo_jax import data

    files = args.train_files
    if args.tokenize:
        from elmo_jax.data.segmentation import segmented_files

        files = segmented_files(files, args.tokenize)
    v, stats = data.vocab_from_files(files, args.max_vocab, args.min_count)
    v.to_file(args.out)
    print(json.dumps({"out": args.out, **stats}))


def _prepare(argv, prog):
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Turn training text into token ids once (memory-mapped numpy: every sentence's "
        "spellings, out-of-vocabulary ones kept, and the spellings): a run reads its batches "
        "from the folder by array slicing. Give the folder as --train_files."))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--train_files", help="glob of sentence-per-line text files")
    src.add_argument("--source", choices=["lm1b"], help="TensorFlow Datasets' lm1b (train)")
    ap.add_argument("--out", required=True, help="the folder to write")
    args = ap.parse_args(argv)
    from elmo_jax import data

    if args.source == "lm1b":
        record = data.TokenCorpus.from_sentences(data.lm1b_sentences("train")).save(args.out)
        print(json.dumps({**record, "out_dir": args.out}))
    else:
        print(json.dumps(data.prepare(args.train_files, args.out)))


def _score(argv, prog):
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Each line's log-probability under the forward and backward LMs (full softmax), one "
        "JSON line per input line (blank lines included): tokens, forward_logprob, "
        "backward_logprob, logprob (their mean, natural log), forward_ppl, backward_ppl, ppl."))
    ap.add_argument("--model", required=True,
                    help="an export folder (train.py export: with softmax.hdf5 and vocab.txt), "
                         "a training workdir, or a registry name whose download has a softmax")
    ap.add_argument("--tokenize", choices=("en", "zh"),
                    help="raw lines: tokenise (Moses) or segment Chinese (jieba) first")
    ap.add_argument("--input", required=True, help="UTF-8 text, one tokenised sentence a line")
    ap.add_argument("--output", required=True, help="JSON lines to write")
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--stateful", action="store_true",
                    help="carry the LSTM state from line to line (as train.py eval reads)")
    args = ap.parse_args(argv)
    from elmo_jax.api.scoring import score_file

    print(json.dumps(score_file(args.model, args.input, args.output, args.batch_size,
                                args.stateful, args.tokenize)))


def _plan(argv, prog):
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Compile the train step ahead of time for a device mesh (nothing runs): simulated "
        "on this CPU, or with --target for a TPU slice's or GPU hosts' own chips by their "
        "own compiler; "
        "print the per-device bytes, FLOPs per step, the collectives and the time of one "
        "1B Word Benchmark epoch (elmo_jax/training/plan.py)."))
    ap.add_argument("--config", required=True, help="a config file or a shipped config's name")
    ap.add_argument("--vocab_size", type=int, required=True, help="softmax size, e.g. 793471")
    ap.add_argument("--mesh", help="e.g. data=8,model=8 (default data=1,model=1); with "
                    "--target only model=M (data: the rest; default: as train.mesh_model 0 "
                    "chooses, a large softmax split over up to one host's chips)")
    ap.add_argument("--target", help="a TPU slice (v4-32, v5e-8, v5e-64, v5e-256, v5p-128, "
                    "v6e-8) or GPU hosts (h100x8, h100x64, a100x8): compiled by its own "
                    "compiler, compile-only (elmo_jax/training/targets.py)")
    ap.add_argument("--per_device_batch", type=int,
                    help="rows per device (bilm-tf's batch_size is per GPU): the global "
                         "model.batch_size becomes this times the devices")
    ap.add_argument("--largest_batch", action="store_true",
                    help="with --target: also find the most rows per device whose step fits "
                         "the chip's memory, by bisection (one compile a probe)")
    ap.add_argument("--utilisation", type=float, default=0.4,
                    help="share of the peak matmul throughput assumed for the epoch time")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                    help="override a config field (e.g. train.compute_dtype=bfloat16, "
                         "train.softmax=full)")
    args = ap.parse_args(argv)
    target = None
    if args.target:
        from elmo_jax.training.targets import get_target

        target = get_target(args.target)
    try:
        sizes = dict(part.split("=") for part in args.mesh.split(",")) if args.mesh else {}
        if target is not None:
            n_model = int(sizes.pop("model", 0))  # 0: train.mesh_model's default, below
            sizes.pop("data", None)
            if n_model < 0 or target.chips % max(n_model, 1):
                raise ValueError
            n_data = target.chips // max(n_model, 1)
        else:
            n_data, n_model = int(sizes.pop("data", 1)), int(sizes.pop("model", 1))
        if sizes or n_data <= 0 or (n_model <= 0 and target is None):
            raise ValueError
    except ValueError:
        ap.error(f"--mesh takes data=D,model=M (with --target: model=M dividing its chips), "
                 f"got {args.mesh!r}")
    import jax

    # simulated devices: set before anything asks JAX for a device
    jax.config.update("jax_platforms", "cpu")
    if target is None:
        jax.config.update("jax_num_cpu_devices", n_data * n_model)
    from elmo_jax.config import load_config
    from elmo_jax.training.plan import plan

    sets = list(args.set)
    if args.per_device_batch:
        n = target.chips if target is not None else n_data * n_model
        sets.append(f"model.batch_size={args.per_device_batch * n}")
    config = load_config(args.config, sets)
    if target is not None and n_model == 0:
        from elmo_jax.training.partitioning import auto_mesh_model

        n_model = config.train.mesh_model or auto_mesh_model(
            args.vocab_size, config.model, target.chips, target.chips_per_host)
        n_data = target.chips // n_model
    print(json.dumps(plan(config, args.vocab_size, n_data, n_model, args.utilisation, target,
                          args.largest_batch)))


def main(argv=None, prog: str = "train.py"):
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"export": _export, "eval": _eval, "vocab": _vocab, "score": _score,
                "plan": _plan, "prepare": _prepare}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:], f"{prog} {argv[0]}")
    return _train(argv, prog)



if __name__ == "__main__":  # the child of `elmo_jax.cli.supervise`
    from elmo_jax.cli.process import run_cli

    run_cli(main)
