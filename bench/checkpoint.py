"""What a checkpoint save costs the training loop: the step time with a save,
synchronous (the save waits for its files, as the loop did until 2026-12) and
asynchronous (orbax copies the arrays to the host, then writes them in a
thread while the next steps run), against the step time without one.

    python -m bench.checkpoint --config bilm-tf-small [--saves 5] [--between 4]

The step is `train.py`'s (`create_train_step`) on the bilm-tf peer's corpus
with its 10,000-word vocabulary (bench/train.py's setup); a save is
`checkpoints.save` into a fresh directory, every `--between` steps. A step
"with a save" is timed from the save's call to the end of the step after it
(sync: save, wait for the files, step). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from bench import _common


def measure(name: str, mode: str, saves: int, between: int) -> dict:
    import jax

    from bench import train
    from elmo_jax.formats import checkpoints
    from elmo_jax.training.workdir import save_checkpoint

    train.ensure_peer()
    config, vocab, built, state, feed = train.setup(name)
    batch, position, _ = feed.next()
    for _ in range(2):  # compile and warm up
        state, m = built.step(state, batch)
        float(m["loss"])
    plain, with_save = [], []
    with tempfile.TemporaryDirectory() as work:
        mngr = checkpoints.manager(work, max_to_keep=2, asynchronous=mode == "async")
        for i in range(saves * between):
            t0 = time.perf_counter()
            saving = i % between == between - 1
            if saving:
                save_checkpoint(mngr, state, position, feed.mesh)
                if mode == "sync":
                    mngr.wait_until_finished()
            state, m = built.step(state, batch)
            float(m["loss"])
            (with_save if saving else plain).append(time.perf_counter() - t0)
        mngr.wait_until_finished()
        size = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(work) for f in fs) / max(1, len(mngr.all_steps()))
    return {"config": name, "mode": mode, "median_step_s": round(statistics.median(plain), 4),
            "median_step_with_save_s": round(statistics.median(with_save), 4),
            "step_with_save_s": [round(t, 4) for t in with_save],
            "checkpoint_mib": round(size / 2**20, 1),
            "state_params": int(sum(x.size for x in jax.tree.leaves(state)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="bilm-tf-small")
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--between", type=int, default=4)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    _common.run_as_the_commands()
    out = {"date": time.strftime("%Y-%m-%d"), "machine": _common.machine(),
           "runs": [measure(args.config, mode, args.saves, args.between)
                    for mode in ("sync", "async")]}
    _common.write_json(args.json_out, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
