"""One config per run: sections, generic overrides, bare options files, errors
that name the field; every shipped config loads."""
import glob
import json
import os

import pytest

from conftest import FIXTURES, REPO
from elmo_jax.config import ConfigError, Config, config_from_dict, load_config, save_config


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.json"))))
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert isinstance(config, Config) and config.description
    assert config_from_dict(config.to_dict()) == config


def test_overrides_reach_every_section():
    config = load_config(os.path.join(REPO, "configs", "tiny.json"), [
        "train.learning_rate=0.05", "model.lstm.dim=128", "model.batch_size=4",
        "data.train_files=corpus/*.txt", 'data.vocab_file="v.txt"', "train.max_steps=null"])
    assert config.train.learning_rate == 0.05
    assert config.model.lstm.dim == 128 and config.model.batch_size == 4
    assert config.data.train_files == "corpus/*.txt" and config.data.vocab_file == "v.txt"
    assert config.train.max_steps is None
    # the file's other fields are untouched
    assert config.model.lstm.projection_dim == load_config(
        os.path.join(REPO, "configs", "tiny.json")).model.lstm.projection_dim


def test_a_bare_bilm_tf_options_file_is_a_config(tmp_path):
    config = load_config(os.path.join(FIXTURES, "options.json"), ["train.seed=3"])
    with open(os.path.join(FIXTURES, "options.json")) as fh:
        raw = json.load(fh)
    assert config.model.lstm.dim == raw["lstm"]["dim"]
    assert config.train.seed == 3 and config.data.train_files is None


def test_resolved_config_round_trips(tmp_path):
    config = load_config(os.path.join(REPO, "configs", "original.json"),
                         ["data.eval_files=held/*", "model.n_tokens_vocab=793471"])
    save_config(config, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == config


@pytest.mark.parametrize("override, match", [
    ("train.learning_rat=0.1", "train.learning_rat"),
    ("model.lstm.dimm=3", "lstm.dimm"),
    ("data.source=web", "data.source"),
    ("train.softmax_init=zeros", "softmax_init.*unigram, bilm-tf"),
    ("train.transfer_guard=never", "transfer_guard.*allow, log, disallow"),
    ("train.profile_steps=5", "profile_steps.*A:B"),
    ("train.profile_steps=9:3", "need 1 <= A <= B"),
    ("optim.lr=1", "starts with model, train or data"),
    ("train.learning_rate", "PATH=VALUE"),
])
def test_bad_overrides_name_the_field(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(os.path.join(REPO, "configs", "tiny.json"), [override])


def test_bad_files_are_clear(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"train": {}}')
    with pytest.raises(ConfigError, match="'model' section"):
        load_config(tmp_path / "b.json")
    (tmp_path / "c.json").write_text('{"model": {}, "optimizer": {}}')
    with pytest.raises(ConfigError, match="unknown section 'optimizer'"):
        load_config(tmp_path / "c.json")
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "missing.json")


def test_a_shipped_config_can_be_named():
    assert load_config("tiny") == load_config(os.path.join(REPO, "configs", "tiny.json"))
    with pytest.raises(FileNotFoundError, match="config file not found: nosuch"):
        load_config("nosuch")


def test_train_py_shorthands_are_config_fields():
    """Every flag train.py offers as a shorthand sets a real config field, and
    says what the field's docstring says, with its type."""
    from elmo_jax.cli import train as cli
    from elmo_jax.config import field_help

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["--help"], prog="elmo-jax train")
    shown = "".join(out.getvalue().split())  # argparse wraps its lines
    for flag, path in cli.SHORTHANDS.items():
        meaning, parse = field_help(path)
        assert meaning and parse in (int, float, str), path
        assert "".join(f"{meaning} (= --set {path}=...)".split()) in shown, flag
        value = {"source": "lm1b", "profile_steps": "3:5", "tokenize": "zh"}.get(
            flag, 7 if parse in (int, float) else "x")
        config = load_config(os.path.join(REPO, "configs", "tiny.json"),
                             [f"{path}={json.dumps(value)}"])
        section, field = path.split(".")
        assert getattr(getattr(config, section), field) == value, flag


def test_bilm_tf_learning_rate_is_honoured_or_refused():
    opts = os.path.join(FIXTURES, "options.json")
    with open(opts) as fh:
        raw = json.load(fh)
    config = config_from_dict({"model": dict(raw, learning_rate=0.05)})
    assert config.train.learning_rate == 0.05
    assert config_from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="disagree"):
        config_from_dict({"model": dict(raw, learning_rate=0.05), "train": {"learning_rate": 0.2}})


@pytest.mark.parametrize("field,value,ok", [
    ("learning_rate", -0.2, False), ("learning_rate", 0, True),
    ("initial_accumulator_value", 0, False), ("max_steps", 0, False), ("max_steps", -5, False),
    ("max_steps", 1, True), ("max_seconds", 0, False), ("log_every", 0, False),
    ("checkpoint_every", 0, False), ("checkpoint_every_seconds", 0, False),
    ("checkpoint_every_seconds", None, True), ("max_to_keep", 0, False),
    ("max_to_keep", 1, True), ("eval_every", -1, False), ("eval_every", 0, True),
    ("eval_batch_size", 0, False), ("nonfinite_skips", -1, False), ("decide_every", 0, False),
    ("input_workers", -1, False), ("log_every", "10", False), ("compute_dtype", "float16", False)])
def test_each_train_setting_is_checked_against_its_range(field, value, ok):
    overrides = [f"train.{field}={json.dumps(value)}"]
    if ok:
        assert getattr(load_config("tiny", overrides).train, field) == value
    else:
        with pytest.raises(ConfigError, match=rf"tiny.json: 'train\.{field}' must be .*got {value!r}"):
            load_config("tiny", overrides)


def test_every_setting_out_of_range_is_one_error_line_before_anything_runs(tmp_path):
    """The issue's cases through train.py: each is named on its own line, the
    workdir is not made, nothing compiles (the command fails in seconds)."""
    import subprocess
    import sys

    work = tmp_path / "w"
    r = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--config", "tiny",
                        "--train_files", os.path.join(FIXTURES, "train", "data.txt"),
                        "--vocab_file", os.path.join(FIXTURES, "train", "vocab.txt"),
                        "--workdir", str(work), "--max_steps", "0", "--log_every", "0",
                        "--checkpoint_every", "0", "--set", "train.learning_rate=-0.2",
                        "--set", "train.max_to_keep=0"],
                       capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and all(line.startswith("error: ") and "tiny.json: 'train." in line
                                     for line in lines), r.stderr
    assert [line.split("'")[1] for line in lines] == [
        "train.learning_rate", "train.max_steps", "train.log_every", "train.checkpoint_every",
        "train.max_to_keep"]
    assert not work.exists()
