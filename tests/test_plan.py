"""`train.py plan`: the train step compiled ahead of time for a simulated mesh;
the per-device bytes follow the shardings (the softmax split over `model`).
Marked e2e (compiles the tiny train step in subprocesses)."""
import json
import os
import subprocess
import sys

import jax
import pytest

from conftest import REPO
from elmo_jax.config import load_config
from elmo_jax.core.bilm import init_params
from elmo_jax.training.plan import train_flops_per_token

pytestmark = pytest.mark.e2e


def _plan(*args):
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "plan", "--config",
                        "tiny", "--vocab_size", "1000", *args], capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_plan_reports_per_device_bytes_flops_and_epoch_time():
    options = load_config("tiny").model
    bilm = sum(x.size * 4 for x in jax.tree.leaves(init_params(options, jax.random.PRNGKey(0))))
    rows, P = 1024, options.lstm.projection_dim  # 1000 words padded to a multiple of 128
    split = _plan("--mesh", "data=2,model=2")
    # the softmax (and its Adagrad accumulator) split in two, the biLM replicated
    assert split["per_device_bytes"]["params"] == bilm + rows // 2 * (P + 1) * 4
    assert split["per_device_bytes"]["optimizer_state"] == split["per_device_bytes"]["params"]
    assert split["per_device_bytes"]["lstm_state"] == 2 * 2 * (32 // 4) * (256 + 64) * 4
    assert split["per_device_bytes"]["compiled_temporaries"] > 0
    assert split["steps_per_lm1b_epoch"] == -(-768_648_884 // (32 * 20))
    tokens = 32 * 20
    assert split["flops_per_step"] == train_flops_per_token(options, 1000, False) * tokens
    assert train_flops_per_token(options, 1000, True) > train_flops_per_token(options, 1000, False)
    hours = split["steps_per_lm1b_epoch"] * split["flops_per_step"] / (4 * 494.7e12 * 0.4) / 3600
    assert split["lm1b_epoch_hours"]["H100-SXM"] == pytest.approx(hours, abs=0.006)


# the softmax split in two (on a TPU), pure data
# parallelism (tiny on a GPU box), and 16 hosts split in four
@pytest.mark.parametrize("target,config,model", [
    ("v5e-8", "tiny", 2), ("h100x8", "tiny", None), ("v5e-64", "tiny", 4)])
def test_plan_for_an_accelerator_compiles_with_only_the_designed_collectives(target, config,
                                                                             model):
    """--target: the train step and embed compiled by the accelerator's own
    compiler (libtpu; the CUDA PJRT plugin) for 8 chips, data 4 x model 2, and
    for 64 (nothing runs). The step's collectives are the ones the design needs: the
    gradient all-reduce of the parameters a chip holds, and the softmax
    shards' exchange of the labels (their ids gathered, their rows
    reduce-scattered and their gradient gathered back); no all-to-all or
    permute, and no gather of activations or of the softmax matrix (the scan's
    [2, K, T B] columns once merged the split batch axis under the time axis,
    and GSPMD gathered every row to every chip: 26 all-gathers of activations
    a step for `tiny` on v5e-8). Quietly for a TPU: libtpu lives apart
    (.venv/accelerators) and is told there is no TPU to look for. Pure data
    parallelism (model 1) needs the gradient all-reduce alone (the sampled
    rows' gather left to GSPMD once brought 3 all-to-alls, 12 permutes and 4
    gathers of ids). On 16 hosts of 4 chips (v5e-64) each model group is one
    host, and each data group the chips at one place of every host: libtpu
    refuses an all-reduce over irregular groups ("Failed to create limited ICI
    routing replica info table"), as it did when each host's chips came in
    their own ring order."""
    chips, per_host = {"v5e-8": (8, 8), "h100x8": (8, 8), "v5e-64": (64, 4)}[target]
    mesh = ["--mesh", f"model={model}"] if model else []  # default: a small softmax whole
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "plan", "--config",
                        config, "--vocab_size", "10000", "--target", target, *mesh,
                        "--per_device_batch", "4"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    if target.startswith("v5e"):
        assert "TPU" not in r.stderr and "WARNING" not in r.stderr, r.stderr[-2000:]
    p = json.loads(r.stdout.splitlines()[-1])
    model = model or 1
    assert p["mesh"] == {"data": chips // model, "model": model}
    chip = "NVIDIA H100 80GB HBM3" if target == "h100x8" else "TPU v5 lite"
    assert p["devices"] == f"{chips} x {chip} ({target}, compile-only)" and p["fits"]
    assert p["hosts"] == chips // per_host and p["model_axis_hosts"] == 1
    step = p["train_step"]
    found = step["collectives"]
    if model == 1:
        assert set(found) == {"all-reduce"}, found
    else:  # the labels' rows: a reduce-scatter (or the all-reduce the compiler makes of it)
        assert {"all-reduce", "all-gather"} <= set(found) <= {"all-reduce", "all-gather",
                                                             "reduce-scatter"}, found
    # the gathered labels' rows of one data slice [2, rows x U x model, P + 1] and the
    # candidates' rows [2, S, P + 1], f32
    options = load_config(config).model
    P, S = options.lstm.projection_dim, options.n_negative_samples_batch
    label_rows = 2 * 4 * options.unroll_steps * model * (P + 1) * 4  # 4 rows a chip
    candidate_rows = 2 * S * (P + 1) * 4
    # the gradients of the parameters a chip holds (the replicated biLM, its softmax
    # shard over the data axis) and the step's few scalars; the candidates' rows'
    # gradient over every chip and, with model > 1, over the model axis, their rows
    # over the model axis, and the labels' rows where the compiler makes their
    # reduce-scatter an all-reduce
    exchanged = label_rows + 3 * candidate_rows if model > 1 else candidate_rows
    assert found["all-reduce"]["bytes"] <= 1.02 * (p["per_device_bytes"]["params"] + exchanged)
    if model > 1:  # the ids, and the labels' rows' gradient back to their shards
        assert found["all-gather"]["bytes"] <= label_rows + 64 * 1024, found
        assert found.get("reduce-scatter", {"bytes": 0})["bytes"] <= label_rows, found
    assert p["embed"]["collectives"] == {} and p["embed"]["rows"] == 4 * chips
    assert 0 < step["peak"] < p["target"]["hbm_bytes"]
    at = p["lm1b_epoch_hours_at"]  # the model's FLOPs at a share of the chips' bf16 peak
    hours = p["steps_per_lm1b_epoch"] * p["flops_per_step"] / (
        chips * p["target"]["peak_tflops"] * 1e12 * 0.6) / 3600
    assert at["60%"] == pytest.approx(hours, rel=1e-3) and at["40%"] == pytest.approx(1.5 * hours,
                                                                                  rel=1e-3)
