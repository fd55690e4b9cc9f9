"""The training loop's own cost: `train_and_evaluate` over real text with the
jitted train step replaced by a stand-in that keeps the device busy for a
fixed time (a host callback that sleeps, dispatched asynchronously like any
step) and reads its batch. Wall time per step over the stand-in's time says
how busy the loop keeps the devices (goal: <= 1.05, the devices busy 95% of
the time). Also counted: the programs compiled after step 1, and the time to
the first step of a restart with the compilation cache warm.

    python -m bench.loop [--step-ms 5] [--steps 2000] [--devices 1] [--processes 1]

`--devices N` simulates N devices in each process (a host of N chips: N
row groups, `original`'s 128 rows each); `--processes 2` runs two processes
with jax.distributed on this machine (each its own devices). Corpus: the
bilm-tf peer's KJV Bible (bench/README: `bash ../shared/peers/bilm_tf/setup.sh`
or its prepare_data.py).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from bench import _common


def stand_in_train_step(ms: float):
    """create_train_step's replacement: the real state and shardings, a step
    that sleeps `ms` on the device (the host goes on) and reads its batch."""
    import jax
    import jax.numpy as jnp

    from elmo_jax.training import partitioning

    real = partitioning.create_train_step

    def busy(tokens):
        time.sleep(ms / 1e3)
        return tokens

    def step(state, batch):
        tokens = jnp.sum(batch["mask"]).astype(jnp.int32)  # a reduction over every device
        tokens = jax.pure_callback(busy, jax.ShapeDtypeStruct((), jnp.int32), tokens)
        loss = jnp.float32(5.0) + 0.0 * tokens
        return state.replace(step=state.step + 1), {
            "loss": loss, "loss_forward": loss, "loss_backward": loss, "grad_norm": loss,
            "tokens": tokens}

    def create(options, config, vocab_size, mesh):
        built = real(options, config, vocab_size, mesh)
        jitted = jax.jit(step, in_shardings=(built.shardings,
                                             partitioning.batch_shardings(mesh)),
                         out_shardings=(built.shardings, None), donate_argnums=0)
        return built._replace(step=jitted)

    return create


def worker(args) -> dict:
    """One process's run (in a child: the device count is set before JAX)."""
    import jax

    if args.processes > 1:
        jax.distributed.initialize(f"localhost:{args.port}", args.processes, args.process_id)
    from elmo_jax.config import DataConfig
    from elmo_jax.training import loop

    corpus, vocab_file = _corpus()
    loop.create_train_step = stand_in_train_step(args.step_ms)
    rows = 128 * jax.device_count()  # `original`'s 128 rows a device
    config = _common.load_config("tiny").replace(data=DataConfig(
        train_files=corpus, vocab_file=vocab_file))
    config = config.replace(
        model=config.model.replace(batch_size=rows, unroll_steps=20, n_tokens_vocab=None),
        train=config.train.__class__(**{**config.train.__dict__, "max_steps": args.steps,
                                        "log_every": args.steps // 10,
                                        "checkpoint_every": 10**9}))
    records = []
    for attempt in ("first", "restart"):  # the restart: a fresh workdir, a warm cache
        work = os.path.join(args.work, attempt)
        t0 = time.time()
        loop.train_and_evaluate(config, work, progress=False)
        with open(os.path.join(work, "metrics.jsonl")) as fh:
            logs = [json.loads(line) for line in fh]
        first_log = logs[0]
        records.append({"attempt": attempt, "wall_s": round(time.time() - t0, 2),
                        "start_to_first_log_s": round(first_log["elapsed_sec"], 3),
                        "logs": logs})
        if attempt == "first" and not args.restart:
            break
    logs = records[0]["logs"]
    # steady state: from the second log record to the last
    per_step = ((logs[-1]["elapsed_sec"] - logs[1]["elapsed_sec"])
                / (logs[-1]["step"] - logs[1]["step"]))
    return {"process": jax.process_index(), "devices": jax.device_count(), "rows": rows,
            "step_ms": args.step_ms, "steps": args.steps,
            "wall_per_step_ms": round(per_step * 1e3, 3),
            "ratio": round(per_step * 1e3 / args.step_ms, 4),
            "compiled_since_step_1": max(r.get("compiled_since_step_1", 0) for r in logs),
            "runs": [{k: v for k, v in r.items() if k != "logs"} for r in records]}


def _corpus():
    data = _common.bilm_tf_data_dir()
    corpus = os.path.join(data, "train.txt")
    if not os.path.exists(corpus):
        raise SystemExit(f"no KJV corpus at {corpus}: run ../shared/peers/bilm_tf/setup.sh "
                         "(or its prepare_data.py)")
    vocab = os.path.join(tempfile.gettempdir(), "elmo-jax-bench-loop-vocab.txt")
    if not os.path.exists(vocab):
        from elmo_jax.vocab import Vocabulary, read_word_list
        Vocabulary(read_word_list(os.path.join(data, "vocab_full.txt"))[:10_000]).to_file(vocab)
    return corpus, vocab


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--devices", type=int, default=1, help="simulated devices a process")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--restart", action="store_true",
                    help="run again in a fresh workdir with the compilation cache warm")
    ap.add_argument("--json-out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    cache = tempfile.mkdtemp(prefix="elmo-jax-bench-xla-")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}",
               JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    procs, work = [], tempfile.mkdtemp(prefix="elmo-jax-bench-loop-")  # one, shared
    for i in range(args.processes):
        cmd = [sys.executable, "-m", "bench.loop", "--worker", "--step-ms", str(args.step_ms),
               "--steps", str(args.steps), "--processes", str(args.processes),
               "--process-id", str(i), "--port", str(port),
               "--work", work]
        procs.append(subprocess.Popen(cmd + (["--restart"] if args.restart else []), env=env,
                                      stdout=subprocess.PIPE, text=True, cwd=_common.REPO))
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a worker failed ({p.returncode})")
        results.append(json.loads(next(x for x in out.splitlines()
                                       if x.startswith("RESULT "))[7:]))
    out = {"benchmark": "loop", "date": time.strftime("%Y-%m-%d"), "command": " ".join(
        ["python -m bench.loop", *(argv if argv is not None else sys.argv[1:])]),
        "processes": results, **_common.machine()}
    _common.write_json(args.json_out, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
