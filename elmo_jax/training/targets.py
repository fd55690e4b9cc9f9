"""Named accelerator targets for `train.py plan --target`: the chips a plan is
compiled for, by the accelerator's own compiler on this CPU host
(compile-only devices: nothing runs), with each chip's memory and peak.

TPU slices are compiled for by libtpu (the version jax's `tpu` extra pins),
which `make` installs apart from the environment, in .venv/accelerators: in
site-packages it would make every JAX start look for a TPU and warn. Figures
are the vendors' published specs per chip: HBM, and dense bf16 peak TFLOP/s.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    platform: str            # "tpu"
    topology: str            # jax.experimental.topologies' name
    chips: int
    chips_per_host: int
    hbm_gib: float           # per chip
    peak_tflops: float       # per chip, dense bf16 (float32 matmuls run as bf16 passes)
    chip: str


TARGETS = {t.name: t for t in [
    # Cloud TPU v4: 32 GiB HBM2, 275 TFLOP/s bf16; a v4-32 slice is 16 chips (2 cores each)
    Target("v4-32", "tpu", "v4:2x2x4", 16, 4, 32.0, 275.0, "TPU v4"),
    # Cloud TPU v5e: 16 GiB HBM2e, 197 TFLOP/s bf16; v5e-8 is one host of 8 chips
    Target("v5e-8", "tpu", "v5e:2x4", 8, 8, 16.0, 197.0, "TPU v5 lite"),
    Target("v5e-64", "tpu", "v5e:8x8", 64, 4, 16.0, 197.0, "TPU v5 lite"),
    Target("v5e-256", "tpu", "v5e:16x16", 256, 4, 16.0, 197.0, "TPU v5 lite"),
    # Cloud TPU v5p: 95 GiB HBM2e, 459 TFLOP/s bf16; v5p-128 is 64 chips (2 cores each)
    Target("v5p-128", "tpu", "v5p:4x4x4", 64, 4, 95.0, 459.0, "TPU v5p"),
    # Cloud TPU v6e (Trillium): 32 GiB HBM, 918 TFLOP/s bf16; v6e-8 is one host of 8
    Target("v6e-8", "tpu", "v6e:2x4", 8, 8, 32.0, 918.0, "TPU v6e"),
]}

# a CPU host has no TPU: these keep libtpu from looking for one (and warning)
_COMPILE_ONLY_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                     "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}


class TargetError(ValueError):
    """A target that is not named here or whose compiler is not installed."""


def libtpu_path() -> str | None:
    """libtpu.so: $TPU_LIBRARY_PATH, an installed `libtpu`, or the checkout's
    .venv/accelerators (what `make` installs)."""
    if os.environ.get("TPU_LIBRARY_PATH"):
        return os.environ["TPU_LIBRARY_PATH"]
    spec = importlib.util.find_spec("libtpu")
    if spec is not None and spec.submodule_search_locations:
        return os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(checkout, ".venv", "accelerators", "libtpu", "libtpu.so")
    return path if os.path.exists(path) else None


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise TargetError(f"unknown target {name!r}; the targets are {', '.join(TARGETS)}")
    return TARGETS[name]


def compile_only_devices(target: Target) -> list:
    """The target's chips as JAX devices that compile but never run (call
    before this process asks JAX for a TPU backend)."""
    from jax.experimental import topologies

    path = libtpu_path()
    if path is None or not os.path.exists(path):
        raise TargetError(f"--target {target.name} needs libtpu's compiler: run `make venv` "
                          "(it installs requirements-accelerators.txt into .venv/accelerators) "
                          "or pip install 'libtpu==0.0.42.*', or set TPU_LIBRARY_PATH")
    os.environ["TPU_LIBRARY_PATH"] = path
    for key, value in _COMPILE_ONLY_ENV.items():
        os.environ.setdefault(key, value)
    topology = topologies.get_topology_desc(platform=target.platform,
                                            topology_name=target.topology)
    devices = list(topology.devices)
    if len(devices) != target.chips:
        raise TargetError(f"{target.topology} has {len(devices)} devices, not {target.chips}")
    return devices
