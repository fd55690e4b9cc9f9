"""The training loop's own cost: `train_and_evaluate` over real text with the
jitted train step replaced by a stand-in that keeps the device busy for a
fixed time (a loop of dependent scalar steps, calibrated to `--step-ms`: one
core busy, dispatched asynchronously like any step) after reading its batch.
Wall time per step over the stand-in's own time (back to back, nothing else
running) says how busy the loop keeps the devices (goal: <= 1.05, the devices
busy 95% of the time). On this 2-core machine the "device" takes one core and
the host's loop and input thread share the other. Also counted: the programs
compiled after step 1.

    python -m bench.loop [--step-ms 5] [--steps 2000] [--processes 1]

Each process has one device and makes `original`'s 128 rows a step;
`--processes 2` runs two processes with jax.distributed on this machine (the
step's sum then crosses them). Not measured here: a process of 8 simulated
devices, where the other seven wait for the busy one in a collective and XLA's
CPU runtime gave up on that rendezvous after 40 s (the stand-in is a CPU
artifact; the host's rate for 8 devices is bench/host_input.py's). Corpus: the
bilm-tf peer's KJV Bible (`bash ../shared/peers/bilm_tf/setup.sh`, or its
prepare_data.py alone).
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


def _spin(n, x):
    """n dependent scalar steps: one core busy, no memory traffic, no callback
    (XLA runs a program with a host callback synchronously on the CPU, so a
    sleeping callback would block the host's loop as no accelerator does)."""
    import jax

    return jax.lax.fori_loop(0, n, lambda i, y: y * 0.999999 + 1e-6, x)


def calibrate(ms: float) -> tuple[int, float]:
    """(loop trip count whose program runs `ms` on this CPU, the program's
    measured ms back to back): the stand-in's own time, the bench's unit."""
    import jax
    import jax.numpy as jnp

    spin = jax.jit(_spin)
    n, x = 100_000, jnp.float32(1.0)
    for _ in range(3):
        spin(n, x).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(20):
            x = spin(n, x)
        x.block_until_ready()
        took = (time.perf_counter() - t0) / 20 * 1e3
        n = max(1, int(n * ms / took))
    fixed = jax.jit(lambda x: _spin(n, x))
    fixed(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(200):
        x = fixed(x)
    x.block_until_ready()
    return n, (time.perf_counter() - t0) / 200 * 1e3


def stand_in_train_step(n: int):
    """create_train_step's replacement: the real state and shardings, a step
    that sums its batch's mask over every device (a collective, across the
    processes too) and keeps the first device busy for `n` spin steps (one
    core: on this machine the host's threads keep the other), asynchronously
    like any step."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from elmo_jax.core.softmax import ROWS
    from elmo_jax.training import partitioning

    real = partitioning.create_train_step

    def create(options, config, vocab_size, mesh):
        built = real(options, config, vocab_size, mesh)

        def busy(mask):  # one device's rows
            tokens = jax.lax.psum(jnp.sum(mask).astype(jnp.float32), ROWS)
            trips = jnp.where(jax.lax.axis_index(ROWS) == 0, n, 0)
            spun = jax.lax.fori_loop(0, trips, lambda i, y: y * 0.999999 + 1e-6, tokens)
            return jax.lax.psum(spun * 0.0, ROWS) + tokens

        def step(state, batch):
            tokens = jax.shard_map(busy, mesh=mesh, in_specs=P(ROWS), out_specs=P())(
                batch["mask"])
            loss = tokens * 0.0 + 5.0
            return state.replace(step=state.step + 1), {
                "loss": loss, "loss_forward": loss, "loss_backward": loss, "grad_norm": loss,
                "tokens": tokens}

        jitted = jax.jit(step, in_shardings=(built.shardings,
                                             partitioning.batch_shardings(mesh)),
                         out_shardings=(built.shardings, None), donate_argnums=0)
        BUILT.append((built._replace(step=jitted), mesh))
        return BUILT[-1][0]

    return create


BUILT: list = []  # the stand-in steps made, with their meshes


def stand_in_alone_ms(config, vocab, reps: int = 300) -> float:
    """The last stand-in step's own time: back to back on one placed batch,
    with nothing else running (every process at once)."""
    import jax

    from elmo_jax.training.loop import make_batcher
    from elmo_jax.training.partitioning import global_batch

    built, mesh = BUILT[-1]
    batch = global_batch(next(make_batcher(config, vocab, mesh)), mesh)
    state = built.init(None, None)
    for _ in range(10):
        state, m = built.step(state, batch)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(reps):
        state, m = built.step(state, batch)
    jax.block_until_ready(m)
    return (time.perf_counter() - t0) / reps * 1e3


def worker(args) -> dict:
    """One process's run (in a child: the device count is set before JAX)."""
    import jax

    if args.processes > 1:
        jax.distributed.initialize(f"localhost:{args.port}", args.processes, args.process_id)
    from elmo_jax.config import DataConfig
    from elmo_jax.training import loop
    from elmo_jax.training.workdir import read_metrics

    corpus, vocab_file = _corpus()
    n, spin_ms = calibrate(args.step_ms)
    loop.create_train_step = stand_in_train_step(n)
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
        logs = read_metrics(work)
        first_log = logs[0]
        records.append({"attempt": attempt, "wall_s": round(time.time() - t0, 2),
                        "start_to_first_log_s": round(first_log["elapsed_sec"], 3),
                        "logs": logs})
        if attempt == "first" and not args.restart:
            break
    from elmo_jax.core.vocab import Vocabulary

    stand_in_ms = stand_in_alone_ms(config, Vocabulary.from_file(vocab_file))
    logs = records[0]["logs"]
    # steady state: from the second log record to the last
    per_step = ((logs[-1]["elapsed_sec"] - logs[1]["elapsed_sec"])
                / (logs[-1]["step"] - logs[1]["step"]))
    return {"process": jax.process_index(), "devices": jax.device_count(), "rows": rows,
            "step_ms": args.step_ms, "spin_ms": round(spin_ms, 3),
            "stand_in_alone_ms": round(stand_in_ms, 3),
            "steps": args.steps, "wall_per_step_ms": round(per_step * 1e3, 3),
            "ratio": round(per_step * 1e3 / stand_in_ms, 4),
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
        from elmo_jax.core.vocab import Vocabulary, read_word_list
        Vocabulary(read_word_list(os.path.join(data, "vocab_full.txt"))[:10_000]).to_file(vocab)
    return corpus, vocab


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=2000)
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
               XLA_FLAGS="--xla_force_host_platform_device_count=1",
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
