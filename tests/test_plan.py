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
from elmo_jax.model import init_params
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
