"""The `original` ELMo at the 1B Word Benchmark's vocabulary (793,471 words)
compiled for each named accelerator target by its own compiler
(`train.py plan --target`; compile-only, nothing runs): per chip bytes
against memory, collectives per step, the epoch at 40% and 60% of peak.

    python -m bench.plan_targets [--targets v5e-8,h100x8] [--out bench/results/plan-targets]

bilm-tf's 128 rows per chip; the softmax's model axis is the plan's default
(`train.mesh_model: 0`: up to 8 chips, within one host); bf16 and f32
matmuls, sampled and full softmax.
Each plan is one JSON file in --out (an existing one is kept: rerun with
--force), and the Markdown table of all of them is printed at the end. A TPU
compile of `original` takes about 3 minutes on 2 cores, a GPU one 15 s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import _common

VOCAB = 793471
TARGETS = ["h100x8", "h100x64", "v5e-8", "v4-32", "v5e-64", "v5p-128", "v5e-256", "v6e-8"]


def one(target: str, softmax: str, dtype: str, config: str, rows: int) -> dict:
    cmd = [sys.executable, os.path.join(_common.REPO, "train.py"), "plan", "--config", config,
           "--vocab_size", str(VOCAB), "--target", target,
           "--per_device_batch", str(rows), "--set", f"train.softmax={softmax}",
           "--set", f"train.compute_dtype={dtype}"]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return {**json.loads(r.stdout.splitlines()[-1]), "command": " ".join(cmd[1:]),
            "wall_seconds": round(time.perf_counter() - start, 1)}


def gib(x: int) -> str:
    return f"{x / 2**30:.2f}"


def collectives(c: dict) -> str:
    return ", ".join(f"{k} {v['count']} ({v['bytes'] / 2**20:.1f} MiB)"
                     for k, v in sorted(c.items())) or "none"


def row(p: dict) -> str:
    b, s, e = p["per_device_bytes"], p["train_step"], p["embed"]
    dtype = {"bfloat16": "bf16", "float32": "f32"}[p["compute_dtype"]]
    hours = p["lm1b_epoch_hours_at"]
    fits = "" if p["fits"] else " **(does not fit)**"
    hosts = f", {p['hosts']} hosts" if p.get("hosts", 1) > 1 else ", 1 host"
    return (f"| {p['target']['name']} | data {p['mesh']['data']} x model {p['mesh']['model']}"
            f"{hosts} | "
            f"{p['softmax']} | {dtype} | {p['batch_size']} | {gib(b['compiled_arguments'])} / "
            f"{gib(b['compiled_temporaries'])} / {gib(b['compiled_peak'])} of "
            f"{p['target']['hbm_bytes'] / 2**30:.0f} GiB{fits} | {collectives(s['collectives'])} | "
            f"{hours['40%']} / {hours['60%']} | {gib(e['peak'])} GiB, "
            f"{collectives(e['collectives'])} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="original")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--softmax", default="sampled,full")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rows", type=int, default=128, help="rows per chip")
    ap.add_argument("--out", default=os.path.join(_common.REPO, "bench", "results",
                                                  "plan-targets"))
    ap.add_argument("--force", action="store_true", help="recompile plans already in --out")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    plans = []
    for target in args.targets.split(","):
        for softmax in args.softmax.split(","):
            for dtype in args.dtypes.split(","):
                path = os.path.join(args.out, f"{args.config}_{target}_{softmax}_{dtype}.json")
                if args.force or not os.path.exists(path):
                    p = one(target, softmax, dtype, args.config, args.rows)
                    p["machine"] = _common.machine()
                    with open(path, "w") as f:
                        json.dump(p, f, indent=1)
                with open(path) as f:
                    plans.append(json.load(f))
                print(row(plans[-1]), flush=True)
    print("| target | mesh | softmax | matmuls | global batch | per chip: arguments / "
          "temporaries / peak | collectives per step | epoch h at 40% / 60% | embed: peak, "
          "collectives |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in plans:
        print(row(p))


if __name__ == "__main__":
    main()
