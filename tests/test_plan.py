"""`train.py plan`: the train step compiled ahead of time for a simulated mesh;
the per-device bytes follow the shardings (the softmax split over `model`).
Marked e2e (compiles the tiny train step in subprocesses)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import REPO
from elmo_jax.config import load_config
from elmo_jax.model import init_params

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
    whole = _plan("--mesh", "data=4,model=1", "--set", "train.softmax=full")
    assert split["per_device_bytes"]["params"] == bilm + rows // 2 * (P + 1) * 4
    assert whole["per_device_bytes"]["params"] == bilm + rows * (P + 1) * 4
    # Adagrad keeps one accumulator per parameter, sharded like it
    assert split["per_device_bytes"]["optimizer_state"] == split["per_device_bytes"]["params"]
    for p in (split, whole):
        assert p["per_device_bytes"]["compiled_temporaries"] > 0
        assert p["steps_per_lm1b_epoch"] == -(-768_648_884 // (32 * 20))
        assert np.isfinite(p["lm1b_epoch_hours"]["H100-SXM"])
    assert whole["softmax"] == "full" and whole["flops_per_step"] > split["flops_per_step"]
