"""The memory and epoch plan of the original ELMo at the 1B Word Benchmark's
vocabulary (793,471 words), from `train.py plan` (the train step compiled ahead
of time for simulated CPU meshes; nothing runs).

    python -m bench.plan [--devices 1,8,64] [--json-out bench/results/plan_original.json]

Meshes: 1 device; 8 devices as data=1 x model=8; 64 as data=8 x model=8 (the
softmax split over 8, as `train.mesh_model: 0` chooses for this vocabulary).
The batch is 128 rows per device (bilm-tf's per-GPU batch), so the global batch
grows with the mesh. Prints a Markdown table and the JSON of every plan.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench import _common

VOCAB = 793471
MESHES = {1: (1, 1), 8: (1, 8), 64: (8, 8)}


def one(devices: int, softmax: str, dtype: str, config: str) -> dict:
    data, model = MESHES[devices]
    cmd = [sys.executable, os.path.join(_common.REPO, "train.py"), "plan", "--config", config,
           "--vocab_size", str(VOCAB), "--mesh", f"data={data},model={model}",
           "--set", f"model.batch_size={128 * devices}", "--set", f"train.softmax={softmax}",
           "--set", f"train.compute_dtype={dtype}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ,
                                                                     JAX_PLATFORMS="cpu"))
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.splitlines()[-1])


def gib(x: int) -> str:
    return f"{x / 2**30:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="original")
    ap.add_argument("--devices", default="1,8,64")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    rows = []
    print("| devices (data x model) | softmax | dtype | params + optimizer GiB/device | "
          "compiled peak GiB/device | TFLOP/step | epoch h, H100 / A100 / TPU v5p at 40% |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for devices in (int(d) for d in args.devices.split(",")):
        for softmax in ("sampled", "full"):
            for dtype in ("float32", "bfloat16"):
                p = one(devices, softmax, dtype, args.config)
                rows.append(p)
                b, h = p["per_device_bytes"], p["lm1b_epoch_hours"]
                hours = " / ".join(str(h.get(k, "-")) for k in ("H100-SXM", "A100-SXM", "TPU-v5p"))
                print(f"| {devices} ({p['mesh']['data']} x {p['mesh']['model']}) | {softmax} | "
                      f"{dtype} | {gib(b['params'] + b['optimizer_state'])} | "
                      f"{gib(b['compiled_peak'])} | {p['flops_per_step'] / 1e12:.1f} | {hours} |",
                      flush=True)
    summary = {"benchmark": "plan", "config": args.config, "vocab_size": VOCAB,
               **_common.machine(), "plans": rows}
    _common.write_json(args.json_out, summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
