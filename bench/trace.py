"""Where one training step's time goes, op by op: XLA's own profile of the step
`train.py` runs (jax.profiler), read back with `jax.profiler.ProfileData`, the
time of each compiled op summed over the traced steps and shown with its HLO.

    python -m bench.trace --config bilm-tf-small
    python -m bench.trace --config original --steps 2 --top 40

The ops are XLA's fused kernels ("ynn_fusion" are matrix products, "copy" and
"transpose" fusions are layout changes, "wrapped_broadcast" fills a buffer);
their times are per step, summed over the worker threads, so the total can
exceed the step's wall time when two ops run at once.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

from bench import _common


def op_times(trace_dir: str, steps: int) -> collections.Counter:
    """ms per step of each op name on XLA's worker threads."""
    import jax

    path = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
               key=os.path.getmtime)
    times = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLAEigen"):
                continue
            for ev in line.events:
                if not ev.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
                    times[ev.name] += ev.duration_ns / 1e6 / steps
    return times


def device_busy_fraction(trace_dir: str, step_name: str = "train") -> dict:
    """The share of the traced steps' wall time in which a device ran work: the
    union of the device planes' events (an accelerator's kernels; on a CPU,
    XLA's worker threads) between the first traced step's start and the last
    one's end (the loop's `train` step annotations on the host; the corpus
    job's are `embed_batch`)."""
    import jax

    path = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
               key=os.path.getmtime)
    planes = jax.profiler.ProfileData.from_file(path).planes
    steps, busy = [], []
    for plane in planes:
        device = plane.name.startswith("/device:")
        for line in plane.lines:
            for ev in line.events:
                if not device and ev.name == step_name:
                    steps.append((ev.start_ns, ev.start_ns + ev.duration_ns))
                if device or (line.name.startswith("tf_XLAEigen")
                              and not ev.name.startswith(("ThunkExecutor", "SlinkyThreadPool"))):
                    busy.append((ev.start_ns, ev.start_ns + ev.duration_ns))
    if not steps or not busy:
        return {"busy_fraction": None, "traced_steps": len(steps)}
    lo = min(a for a, _ in steps)
    hi = max(b for _, b in busy if b >= lo)
    covered, end = 0.0, lo
    for a, b in sorted(busy):
        a, b = max(a, end), min(b, hi)
        if b > a:
            covered, end = covered + b - a, b
    return {"busy_fraction": round(covered / max(hi - lo, 1), 4), "traced_steps": len(steps),
            "window_ms": round((hi - lo) / 1e6, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bilm-tf-small", help="a configs/ name to train")
    ap.add_argument("--dtype", default="float32", help="the train step's matmul dtype")
    ap.add_argument("--steps", type=int, default=5, help="steps traced (after 3 untraced)")
    ap.add_argument("--top", type=int, default=30, help="ops shown")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    _common.run_as_the_commands()

    import jax

    from bench import train as bench_train

    _, _, built, _, feed = bench_train.setup(args.config, args.dtype)
    batch, _, _ = feed.next()
    state = {"state": built.init(None, None)}  # the step donates its state: thread it

    def one_step():
        state["state"], metrics = built.step(state["state"], batch)
        jax.block_until_ready(metrics)

    for _ in range(3):
        one_step()
    hlo = built.step.lower(state["state"], batch).compile().as_text()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            one_step()
        wall_ms = 1e3 * (time.perf_counter() - t0) / args.steps
        jax.profiler.stop_trace()
        times = op_times(trace_dir, args.steps)

    def describe(name):  # the op's HLO line: its shape and what it computes
        m = re.search(r"\n\s*(?:ROOT )?%" + re.escape(name) + r" = ([^\n]*)", hlo)
        if not m:
            return ""
        where = re.search(r'op_name="([^"]*)"', m.group(1))
        return m.group(1).split(" fusion(")[0].split(" ")[0] + (
            f"  {where.group(1)}" if where else "")

    print(f"step {wall_ms:.1f} ms (traced), ops {sum(times.values()):.1f} ms summed over threads")
    top = [{"op": name, "ms_per_step": round(ms, 2), "hlo": describe(name)}
           for name, ms in times.most_common(args.top)]
    for row in top:
        print(f"{row['ms_per_step']:9.2f} ms  {row['op']:36s} {row['hlo'][:110]}")
    _common.write_json(args.json_out, {"benchmark": "trace", "config": args.config,
                                       "dtype": args.dtype, **_common.machine(),
                                       "step_ms": round(wall_ms, 1), "ops": top})
    return 0


if __name__ == "__main__":
    sys.exit(main())
