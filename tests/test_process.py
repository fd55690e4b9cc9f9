"""The library leaves the process as it found it: training twice in one
Python process (a notebook) works, and afterwards the signal handlers, jax's
config, the umask, orbax's handlers, TensorStore's defaults, JAX's
monitoring listeners and the log levels are what they were. What does change a process belongs to the commands
(`cli/`), and the private APIs they use are those of the installed versions."""
import inspect
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, write_grammar_corpus

_TWICE = r"""
import json, logging, os, signal, sys
import jax, orbax.checkpoint as ocp
from jax._src import cache_key, monitoring
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

def umask():
    with open("/proc/self/status") as fh:
        return next(l.split()[1] for l in fh if l.startswith("Umask:"))

def snapshot(loggers):
    return {"signals": [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
            "jax config": {k: repr(v) for k, v in jax.config.values.items()},
            "umask": umask(),
            "orbax array handler": id(ocp.type_handlers.get_type_handler(jax.Array)),
            "jax cache key": id(cache_key._hash_accelerator_config),
            "tensorstore contexts": repr(ts_utils._BASE_TS_CONTEXT),
            "log levels": {n: logging.getLogger(n).level for n in loggers},
            "root handlers": len(logging.getLogger().handlers),
            "jax monitoring listeners": [len(getattr(monitoring, n)) for n in (
                "_event_listeners", "_event_duration_secs_listeners",
                "_event_time_span_listeners", "_scalar_listeners")]}

loggers = [""] + [n for n, l in logging.root.manager.loggerDict.items()
                  if isinstance(l, logging.Logger)]
before = snapshot(loggers)
from elmo_jax import training
from elmo_jax.config import DataConfig, load_config

train, vocab, workdir = sys.argv[1:4]
for steps in (4, 8):  # the second call resumes the first's run
    config = load_config(os.path.join(sys.argv[4], "configs", "tiny.json"), [
        "model.batch_size=8", "model.n_negative_samples_batch=16", f"train.max_steps={steps}",
        "train.checkpoint_every=4", "train.log_every=2"])
    config = config.replace(data=DataConfig(train_files=train, vocab_file=vocab))
    last = training.train_and_evaluate(config, workdir, progress=False)
    assert last["step"] == steps, last
after = snapshot(loggers)
print(json.dumps({k: (before[k], after[k]) for k in before if before[k] != after[k]}))
"""


@pytest.mark.e2e
def test_training_twice_in_one_process_leaves_it_as_it_was(tmp_path):
    files = write_grammar_corpus(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    r = subprocess.run([sys.executable, "-c", _TWICE, files["train.txt"], files["vocab.txt"],
                        str(tmp_path / "run"), REPO], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    changed = json.loads(r.stdout.strip().splitlines()[-1])
    assert changed == {}, changed


def test_the_private_apis_are_those_of_the_installed_jax_and_orbax():
    """elmo_jax/private_apis.py patches jax's persistent-cache key on the CPU
    and orbax's TensorStore retries: when either package changes, this fails
    until the module has been checked against the new one."""
    import jax
    import orbax.checkpoint as ocp
    from jax._src import cache_key
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    from elmo_jax import private_apis

    assert private_apis.written_for_this_jax(), (
        f"jax {jax.__version__} is not the {private_apis.JAX_WRITTEN_FOR}x that "
        "elmo_jax/private_apis.py was written for")
    assert ocp.__version__.startswith(private_apis.ORBAX_WRITTEN_FOR), ocp.__version__
    assert list(inspect.signature(cache_key._hash_accelerator_config).parameters) == [
        "hash_obj", "accelerators"]
    for context in (ts_utils._BASE_TS_CONTEXT, ts_utils._DEFAULT_OCDBT_TS_CONTEXT):
        assert isinstance(context, dict)


def test_the_library_imports_no_command():
    """No module of the library imports `elmo_jax.cli` (the commands import
    the library, never the other way round; a task's own `__main__` block
    may start its command)."""
    import ast

    offenders = []
    for folder, dirs, names in os.walk(os.path.join(REPO, "elmo_jax")):
        dirs[:] = [d for d in dirs if d not in ("cli", "__pycache__")]
        for name in names:
            if not name.endswith(".py") or name == "__main__.py":
                continue
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            main_blocks = {id(n) for node in tree.body if isinstance(node, ast.If)
                           and "__main__" in ast.unparse(node.test) for n in ast.walk(node)}
            for node in ast.walk(tree):
                if id(node) in main_blocks:
                    continue
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(m == "elmo_jax.cli" or m.startswith("elmo_jax.cli.") for m in mods):
                    offenders.append(os.path.relpath(path, REPO))
    assert offenders == []
