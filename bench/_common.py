"""What the side-by-side benchmarks share: where the peers live, running a
child process and reading its peak memory, waiting for a quiet machine, and the
FLOP count of the model.

The peers (../shared/peers, or $ELMO_PEERS_DIR) install AllenNLP's ELMo and
bilm-tf into their own virtual environments under $ELMO_PEERS_HOME (default
~/.cache/elmo-peers); nothing of theirs is copied here.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.abspath(os.environ.get("ELMO_PEERS_DIR")
                        or os.path.join(REPO, "..", "shared", "peers"))
PEERS_HOME = os.environ.get("ELMO_PEERS_HOME") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "elmo-peers")


def bilm_tf_venv() -> str:
    return os.environ.get("PEERS_TF_VENV") or os.path.join(PEERS_HOME, "bilm-tf-venv")


def bilm_tf_data_dir() -> str:
    """The bilm-tf peer's KJV corpus (train.txt, vocab_full.txt)."""
    return os.environ.get("BILM_TF_DATA_DIR") or os.path.join(PEERS_HOME, "bilm-tf-data")


def load_config(name: str):
    """configs/NAME.json (or a path): the one definition of a benchmarked model."""
    from elmo_jax.config import load_config as load

    return load(name)


def peer_dir(name: str) -> str:
    path = os.path.join(PEERS, name)
    if not os.path.isdir(path):
        sys.exit(f"error: the {name} peer harness is not at {path}; set ELMO_PEERS_DIR")
    return path


def ensure_setup(name: str, venv: str) -> None:
    """Run the peer's own one-command setup when its venv is missing."""
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        print(f"[bench] setting up the {name} peer (once): bash setup.sh", file=sys.stderr)
        subprocess.run(["bash", os.path.join(peer_dir(name), "setup.sh")], check=True)


def run_child(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Run a benchmark process; returns its last stdout line as JSON, with its
    peak resident memory (MiB) and wall time added."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.time() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1])
    result["peak_rss_mib_measured"] = round(usage.ru_maxrss / 1024, 1)
    result["process_wall_s"] = round(wall, 1)
    return result


def busy_cores(seconds: float = 1.0) -> float:
    """How many cores other processes keep busy, sampled from /proc/stat."""
    def sample():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return sum(v[:8]) - v[3] - v[4], sum(v[:8])
    b0, t0 = sample()
    time.sleep(seconds)
    b1, t1 = sample()
    return (b1 - b0) / max(1, t1 - t0) * os.cpu_count()


def wait_quiet(max_wait_s: float = 120.0, threshold_cores: float = 0.3) -> float:
    deadline = time.time() + max_wait_s
    busy = busy_cores(2.0)
    while busy > threshold_cores and time.time() < deadline:
        time.sleep(3.0)
        busy = busy_cores(2.0)
    return busy


def spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return "n/a"
    return f"{min(xs):.0f}-{max(xs):.0f} ({100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%)"


def run_as_the_commands() -> None:
    """Give this elmo-jax process what the commands give theirs: huge pages for
    XLA's buffers (elmo_jax/cli/huge_pages.py; it executes the process again,
    once). Only in elmo-jax's own processes: never in a parent that starts the
    peers, which run as installed and would inherit the setting."""
    from elmo_jax.cli.huge_pages import reexec_with_huge_pages

    reexec_with_huge_pages()


def machine() -> dict:
    return {"date": datetime.date.today().isoformat(), "cpu": platform.processor()
            or platform.machine(), "n_cpus": os.cpu_count(), "python": platform.python_version()}


def forward_flops_per_token(options) -> dict:
    """The model's FLOP count (elmo_jax.training.plan), for the benches' GFLOP/s."""
    from elmo_jax.training.plan import forward_flops_per_token as count

    return count(options)


def write_json(path: str | None, obj: dict) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(obj, fh, indent=2)


def print_runs(runs: dict, rss, first, first_label: str) -> dict:
    """Print one table row per implementation (median tokens/s, spread, peak
    memory, start-up) and return those numbers keyed `<impl>_...`; `rss` and
    `first` read a run's peak memory and start-up seconds."""
    print(f"{'implementation':14s} {'tokens/s (median)':>18s} {'range (spread)':>22s} "
          f"{'peak RSS MiB':>13s} {first_label:>13s}")
    summary = {}
    for impl, rs in runs.items():
        if not rs:
            continue
        tps = [r["tokens_per_s"] for r in rs]
        med, mem = statistics.median(tps), max(map(rss, rs))
        start = statistics.median(map(first, rs))
        print(f"{impl:14s} {med:18.0f} {spread(tps):>22s} {mem:13.0f} {start:13.1f}")
        key = impl.replace("-", "_")
        summary.update({f"{key}_tokens_per_s": med, f"{key}_tokens_per_s_all": tps,
                        f"{key}_peak_rss_mib": mem, f"{key}_first_s": start})
    return summary


def finish(summary: dict, runs: dict, peer: str, json_out: str | None) -> int:
    """Add the ratio to the peer and the runs, write and print the summary."""
    key = peer.replace("-", "_")
    if runs[peer]:
        summary[f"ratio_vs_{key}"] = round(summary["elmo_jax_tokens_per_s"]
                                           / summary[f"{key}_tokens_per_s"], 2)
        if "limit" in summary:  # the same useful work in the peer's time
            summary["limit"][f"{key}_useful_gflops_per_s"] = round(
                summary["limit"]["useful_gflops_per_s"] / summary[f"ratio_vs_{key}"], 1)
    summary["runs"] = runs
    write_json(json_out, summary)
    print(json.dumps(summary))
    return 0


# --- the walls: what the machine can do, measured in the same run -------------------------

def call_times(f, *args, n: int = 3, min_seconds: float = 0.0, warmup: bool = True
               ) -> list[float]:
    """Wall times of calls f(*args), each waited for (`jax.block_until_ready`):
    n calls, or more until they add up to `min_seconds`, after one call that
    compiles it (unless `warmup=False`). The benches' one timer."""
    import jax

    if warmup:
        jax.block_until_ready(f(*args))
    times: list[float] = []
    while len(times) < n or sum(times) < min_seconds:
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return times


class CompileCount:
    """How many times XLA has compiled a program in this process (JAX's public
    monitoring events), to leave the steps that compiled out of a median."""

    def __init__(self):
        import jax

        self.n = 0
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.n += 1


def matmul_peak_gflops(dtype: str = "float32", n: int = 2048, reps: int = 10) -> float:
    """Measured matmul throughput of this machine through XLA (n x n x n, f32
    accumulation for bf16), GFLOP/s."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n)).astype(dtype)
    f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    return 2 * n ** 3 / statistics.median(call_times(f, a, n=reps)) / 1e9


def memory_bandwidth_gbs(mib: int = 512, reps: int = 7) -> float:
    """Measured read bandwidth from DRAM through XLA (a sum over `mib` MiB, far
    larger than the caches), GB/s."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)
    return x.nbytes / statistics.median(call_times(jax.jit(jnp.sum), x, n=reps)) / 1e9


def lstm_stream_bytes(options, rows: int, timesteps: int, weight_bytes: int, train: bool,
                      positions: int | None = None) -> dict:
    """Bytes a pass over `rows` x `timesteps` must move to and from memory at the
    least, for the layers whose weights cannot stay in cache:

    - weights: each recurrent step reads every layer's and direction's recurrent
      [P, 4D] and projection [D, P] matrices (training: again in the backward
      scan); the other weights once (training: parameters, gradients and
      Adagrad accumulators read and written once, in float32);
    - activations: the gate pre-activations [4D] per position, layer and
      direction are written and read once (training: the cell, hidden and
      projected states too, kept for the backward pass and read back), float32.
    `positions` (default rows x timesteps) counts the real ones of a packed schedule."""
    lo = options.lstm
    P, D, L = lo.projection_dim, lo.dim, lo.n_layers
    per_step = 2 * L * (P * 4 * D + D * P)                      # recurrent + projection params
    recurrent = timesteps * per_step * weight_bytes * (2 if train else 1)
    c = options.char_cnn
    encoder = (sum(w * c.embedding_dim * n for w, n in c.filters)
               + c.n_highway * 2 * c.n_filters ** 2 + c.n_filters * P)
    others = (2 * L * P * 4 * D + encoder) * weight_bytes   # input-gate matrices + encoder
    positions = rows * timesteps if positions is None else positions
    per_position = 2 * L * 4 * D * 4 * 2                      # gates written + read
    if train:
        per_position += 2 * L * (2 * D + P) * 4 * 2           # c, h, projection kept + read
        n_params = per_step + 2 * L * P * 4 * D + encoder
        others += n_params * 4 * 5                             # params, grad, accumulator
    return {"weights": recurrent + others, "activations": positions * per_position}


def limit_column(useful_flops: float, seconds: float, peak_gflops: float, bytes_moved: float,
                 bandwidth_gbs: float) -> dict:
    """Which wall a measurement stands against and how far: the time the
    useful FLOPs take at the measured matmul peak, the time the bytes take at
    the measured bandwidth, and the share of the measured time each explains."""
    t_flops = useful_flops / (peak_gflops * 1e9)
    t_bytes = bytes_moved / (bandwidth_gbs * 1e9)
    return {"useful_gflops_per_s": round(useful_flops / seconds / 1e9, 1),
            "matmul_peak_gflops_per_s": round(peak_gflops, 1),
            "bandwidth_gbs": round(bandwidth_gbs, 1),
            "bytes_per_pass_gb": round(bytes_moved / 1e9, 3),
            "compute_floor_s": round(t_flops, 4), "memory_floor_s": round(t_bytes, 4),
            "of_compute_wall": round(t_flops / seconds, 2),
            "of_memory_wall": round(t_bytes / seconds, 2),
            "wall": "compute" if t_flops >= t_bytes else "memory"}


def median_limit(limits: list[dict]) -> dict:
    """The median of each number over runs (the wall named by the median run)."""
    keys = [k for k, v in limits[0].items() if isinstance(v, (int, float))]
    out = {k: round(statistics.median(x[k] for x in limits), 4) for k in keys}
    out["wall"] = "compute" if out["compute_floor_s"] >= out["memory_floor_s"] else "memory"
    return out


def print_limit(lim: dict) -> None:
    print(f"limit: {lim['useful_gflops_per_s']} GFLOP/s useful of a measured "
          f"{lim['matmul_peak_gflops_per_s']} GFLOP/s matmul peak ({100 * lim['of_compute_wall']:.0f}% "
          f"of the compute wall); {lim['bytes_per_pass_gb']} GB to stream at a measured "
          f"{lim['bandwidth_gbs']} GB/s ({100 * lim['of_memory_wall']:.0f}% of the memory wall); "
          f"nearer wall: {lim['wall']}")
