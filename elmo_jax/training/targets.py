"""Named accelerator targets for `train.py plan --target`: the chips a plan is
compiled for, by the accelerator's own compiler on this CPU host
(compile-only devices: nothing runs), with each chip's memory and peak.

TPU slices are compiled for by libtpu (the version jax's `tpu` extra pins),
GPU hosts by the CUDA PJRT plugin (jax-cuda12-plugin and -pjrt, no CUDA
libraries needed to compile) given XLA's description of the GPU. `make`
installs both apart from the environment, in .venv/accelerators: in
site-packages they would make every JAX start look for a TPU or a GPU and
warn. Figures are the vendors' published specs per chip: memory, and dense
bf16 peak TFLOP/s.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import site

from elmo_jax import environment
from elmo_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    platform: str            # "tpu"
    topology: str            # jax.experimental.topologies' name
    chips: int
    chips_per_host: int
    hbm_gib: float           # per chip
    peak_tflops: float       # per chip, dense bf16
    chip: str
    gpu: str | None = None   # a GPU's key in GPU_DEVICE_INFO
    # chips a host, x y z, where libtpu's default for the topology is not the
    # product's (it makes v5e:2x4 two hosts of 2x2; a v5litepod-8 is one host)
    chips_per_host_bounds: tuple | None = None
    # per chip, dense float32 matmuls at JAX's default precision: TF32 tensor cores
    # on a GPU; on a TPU (None) they run as bf16 passes, at the bf16 peak
    peak_tflops_f32: float | None = None

    def peak(self, compute_dtype: str) -> float:
        """Dense TFLOP/s a chip for matmuls in `compute_dtype`."""
        if compute_dtype == "bfloat16" or self.peak_tflops_f32 is None:
            return self.peak_tflops
        return self.peak_tflops_f32


TARGETS = {t.name: t for t in [
    # Cloud TPU v4: 32 GiB HBM2, 275 TFLOP/s bf16 per chip; a v4-32 slice is 16 chips,
    # 4 a host, and the compiler sees each chip's 2 TensorCores as devices: 32 of
    # them, each with half a chip's memory and peak
    Target("v4-32", "tpu", "v4:2x2x4", 32, 8, 16.0, 137.5, "TPU v4"),
    # Cloud TPU v5e: 16 GiB HBM2e, 197 TFLOP/s bf16; v5e-8 is one host of 8 chips
    Target("v5e-8", "tpu", "v5e:2x4", 8, 8, 16.0, 197.0, "TPU v5 lite",
           chips_per_host_bounds=(2, 4, 1)),
    Target("v5e-64", "tpu", "v5e:8x8", 64, 4, 16.0, 197.0, "TPU v5 lite"),
    Target("v5e-256", "tpu", "v5e:16x16", 256, 4, 16.0, 197.0, "TPU v5 lite"),
    # Cloud TPU v5p: 95 GiB HBM2e, 459 TFLOP/s bf16; v5p-128 is 64 chips (2 cores each)
    Target("v5p-128", "tpu", "v5p:4x4x4", 64, 4, 95.0, 459.0, "TPU v5p"),
    # Cloud TPU v6e (Trillium): 32 GiB HBM, 918 TFLOP/s bf16; v6e-8 is one host of 8
    Target("v6e-8", "tpu", "v6e:2x4", 8, 8, 32.0, 918.0, "TPU v6e",
           chips_per_host_bounds=(2, 4, 1)),
    # NVIDIA H100 SXM5 80 GB: 989.4 TFLOP/s bf16 dense, 494.7 TF32; hosts of 8
    # (topology hosts x 8)
    Target("h100x8", "cuda", "1x1x8", 8, 8, 79.1, 989.4, "NVIDIA H100 80GB HBM3", "h100",
           peak_tflops_f32=494.7),
    Target("h100x64", "cuda", "1x8x8", 64, 8, 79.1, 989.4, "NVIDIA H100 80GB HBM3", "h100",
           peak_tflops_f32=494.7),
    # NVIDIA H200 SXM 141 GB (the H100's GH100 at its clocks, HBM3e): the same peaks
    Target("h200x8", "cuda", "1x1x8", 8, 8, 140.4, 989.4, "NVIDIA H200", "h200",
           peak_tflops_f32=494.7),
    # NVIDIA A100 SXM4 80 GB: 312 TFLOP/s bf16 dense, 156 TF32
    Target("a100x8", "cuda", "1x1x8", 8, 8, 79.3, 312.0, "NVIDIA A100-SXM4-80GB", "a100",
           peak_tflops_f32=156.0),
]}

# What XLA's GPU compiler needs to know of a GPU it cannot see: the device
# descriptions of XLA's own tools (xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb and
# a100_sxm_80.txtpb), as fields; the H200 is the H100's with its memory (143,771
# MiB, as nvidia-smi gives it) and bandwidth (4.8 TB/s).
GPU_DEVICE_INFO = {
    "h100": {"core_count": 132, "fpus_per_core": 128, "shared_memory_per_core": 233472,
             "shared_memory_per_block_optin": 232448, "memory_bandwidth": 3352320000000,
             "l2_cache_size": 52428800, "clock_rate_ghz": 1.98,
             "device_memory_size": 84978434048, "compute_capability": 9,
             "description": "NVIDIA H100 80GB HBM3"},
    "h200": {"core_count": 132, "fpus_per_core": 128, "shared_memory_per_core": 233472,
             "shared_memory_per_block_optin": 232448, "memory_bandwidth": 4800000000000,
             "l2_cache_size": 52428800, "clock_rate_ghz": 1.98,
             "device_memory_size": 143771 * 2 ** 20, "compute_capability": 9,
             "description": "NVIDIA H200"},
    "a100": {"core_count": 108, "fpus_per_core": 64, "shared_memory_per_core": 167936,
             "shared_memory_per_block_optin": 166912, "memory_bandwidth": 2039040000000,
             "l2_cache_size": 41943040, "clock_rate_ghz": 1.41,
             "device_memory_size": 85100068864, "compute_capability": 8,
             "description": "NVIDIA A100-SXM4-80GB"},
}


def gpu_target_config(gpu: str) -> str:
    """XLA's GpuTargetConfig text for one of GPU_DEVICE_INFO's GPUs."""
    d = GPU_DEVICE_INFO[gpu]
    fields = {"threads_per_block_limit": 1024, "threads_per_warp": 32,
              "shared_memory_per_block": 49152,
              "shared_memory_per_core": d["shared_memory_per_core"],
              "threads_per_core_limit": 2048, "core_count": d["core_count"],
              "fpus_per_core": d["fpus_per_core"], "block_dim_limit_x": 2147483647,
              "block_dim_limit_y": 65535, "block_dim_limit_z": 65535,
              "memory_bandwidth": d["memory_bandwidth"], "l2_cache_size": d["l2_cache_size"],
              "clock_rate_ghz": d["clock_rate_ghz"],
              "device_memory_size": d["device_memory_size"],
              "shared_memory_per_block_optin": d["shared_memory_per_block_optin"]}
    body = "".join(f"  {k}: {v}\n" for k, v in fields.items())
    body += (f"  cuda_compute_capability {{ major: {d['compute_capability']} }}\n"
             "  registers_per_core_limit: 65536\n  registers_per_block_limit: 65536\n")
    return (f"gpu_device_info {{\n{body}}}\nplatform_name: \"CUDA\"\n"
            f"device_description_str: \"{d['description']}\"\n")

# a CPU host has no TPU: these keep libtpu from looking for one (and warning),
# and let several compiling processes load it at once (libtpu otherwise holds
# /tmp/libtpu_lockfile for the one process that may drive the TPU)
_COMPILE_ONLY_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                     "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
                     "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


class TargetError(UserError, ValueError):
    """A target that is not named here or whose compiler is not installed."""


def accelerators_dir() -> str:
    """Where `make` installs the compilers: the checkout's .venv/accelerators
    ($ELMO_JAX_ACCELERATORS elsewhere)."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return environment.accelerators_dir(checkout)


def libtpu_path() -> str | None:
    """libtpu.so: $TPU_LIBRARY_PATH, an installed `libtpu`, or accelerators_dir()."""
    if os.environ.get("TPU_LIBRARY_PATH"):
        return os.environ["TPU_LIBRARY_PATH"]
    spec = importlib.util.find_spec("libtpu")
    if spec is not None and spec.submodule_search_locations:
        return os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
    path = os.path.join(accelerators_dir(), "libtpu", "libtpu.so")
    return path if os.path.exists(path) else None


def _cuda_plugin_devices(target: Target) -> list:
    from jax.experimental import topologies

    try:
        installed = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        installed = False
    if not installed:
        where = accelerators_dir()
        if not os.path.isdir(os.path.join(where, "jax_plugins", "xla_cuda12")):
            raise TargetError(f"--target {target.name} needs the CUDA PJRT plugin's compiler: "
                              "run `make venv` (it installs requirements-accelerators.txt into "
                              ".venv/accelerators) or pip install jax-cuda12-plugin==0.10.2 "
                              "jax-cuda12-pjrt==0.10.2")
        site.addsitedir(where)  # JAX finds the plugin in the jax_plugins namespace
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no CUDA runtime here
    return list(topologies.get_topology_desc(platform="cuda", topology_name=target.gpu,
                                             target_config=gpu_target_config(target.gpu),
                                             topology=target.topology).devices)


def chip_target(device_kind: str) -> Target | None:
    """A target whose chip is `device_kind` (a JAX device's), for its peaks."""
    return next((t for t in TARGETS.values() if t.chip == device_kind), None)


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise TargetError(f"unknown target {name!r}; the targets are {', '.join(TARGETS)}")
    return TARGETS[name]


def _libtpu_devices(target: Target) -> list:
    from jax.experimental import topologies

    path = libtpu_path()
    if path is None or not os.path.exists(path):
        raise TargetError(f"--target {target.name} needs libtpu's compiler: run `make venv` "
                          "(it installs requirements-accelerators.txt into .venv/accelerators) "
                          "or pip install 'libtpu==0.0.42.*', or set TPU_LIBRARY_PATH")
    os.environ["TPU_LIBRARY_PATH"] = path
    for key, value in _COMPILE_ONLY_ENV.items():
        os.environ.setdefault(key, value)
    hosts = ({"chips_per_host_bounds": list(target.chips_per_host_bounds)}
             if target.chips_per_host_bounds else {})
    return list(topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                             **hosts).devices)


def compile_only_devices(target: Target) -> list:
    """The target's chips as JAX devices that compile but never run (call
    before this process asks JAX for a TPU or GPU backend)."""
    devices = (_cuda_plugin_devices if target.platform == "cuda" else _libtpu_devices)(target)
    if len(devices) != target.chips:
        raise TargetError(f"{target.topology} has {len(devices)} devices, not {target.chips}")
    per_host = len(devices) // len({d.process_index for d in devices})
    if per_host != target.chips_per_host:
        raise TargetError(f"{target.topology} has {per_host} devices a host, not "
                          f"{target.chips_per_host}")
    return devices
