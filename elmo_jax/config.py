"""A run's configuration: one JSON file, three sections.

    {"description": "...",
     "model": <bilm-tf's options.json, unchanged>,
     "train": <TrainConfig fields>,
     "data":  <DataConfig fields>}

Only "model" is required; a bare bilm-tf options.json (with "lstm" and
"char_cnn" at the top) is read as the "model" of a config with default
training settings, so published options files drop in. Any field can be
overridden by a dotted path (`train.learning_rate=0.1`, `model.lstm.dim=512`,
`data.train_files=corpus/*.txt`); the value is read as JSON when it parses,
else kept as a string. A workdir keeps the resolved config (`config.json`).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Sequence

from elmo_jax.errors import UserError
from elmo_jax.storage.files import read_json, write_json
from elmo_jax.core.options import ElmoOptions, OptionsError

SECTIONS = ("description", "model", "train", "data")
# a run of several processes: how it is launched, not what it computes (the
# commands' --heartbeat_timeout and --wait_for_peers; `training.pod`)
HEARTBEAT_TIMEOUT = 100.0  # seconds a peer may stay silent before every process stops
WAIT_FOR_PEERS = 300.0     # seconds to wait for every process at start
SOFTMAX_INITS = ("unigram", "bilm-tf")  # how the softmax biases start (steps.init_softmax)


class ConfigError(UserError, ValueError):
    """A config file or override that cannot describe a run; names the field."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train (the "train" section). bilm-tf's own training fields
    (batch_size, unroll_steps, n_negative_samples_batch, dropout,
    all_clip_norm_val, n_epochs, n_train_tokens) stay in the model options.

    Attributes:
        learning_rate: Adagrad's (bilm-tf's 0.2).
        initial_accumulator_value: Adagrad's (bilm-tf's 1.0).
        scale_loss_by_unroll_steps: the gradient of loss * unroll_steps, as
            bilm-tf's compute_gradients.
        seed: the parameters' initialisation and the batches' order.
        max_steps: the run's steps; None: n_epochs over n_train_tokens.
        max_seconds: stop (and checkpoint) after this wall time.
        log_every: steps between metrics records (metrics.jsonl, TensorBoard).
        eval_every: steps between held-out evaluations; 0: at the end only.
        checkpoint_every: steps between checkpoints.
        checkpoint_every_seconds: also save after this much wall time.
        max_to_keep: the newest checkpoints kept.
        async_checkpoints: files written while training goes on; None: on
            accelerators only (checkpoints.py).
        nonfinite_skips: a non-finite loss goes back to the last checkpoint
            and past the batch, this many times a run.
        eval_batch_size: rows of an evaluation batch.
        eval_unroll_steps: tokens per row of an evaluation batch.
        mesh_model: devices on the mesh's `model` axis (softmax rows split);
            0: chosen by the vocabulary's size.
        softmax: "sampled" (bilm-tf's) or "full": train on the exact softmax.
        softmax_init: "unigram": the biases start at the sampler's Zipf law;
            "bilm-tf": at 0 (steps.init_softmax).
        softmax_chunk: vocabulary rows per chunk of the full softmax.
        input_workers: > 0: batches made ahead in this many processes.
        decide_every: with several processes, steps between looking up an
            agreed stop or timed save (pod.Decisions).
        transfer_guard: device-to-host transfers between log and save steps:
            "disallow" makes a hidden sync an error.
        profile_steps: "A:B": a jax.profiler trace of steps A..B in
            WORKDIR/tensorboard.
        scan_unroll: the LSTMs' `lax.scan` unroll.
        compute_dtype: "bfloat16": bf16 matmuls, float32 state and optimizer.
    """
    learning_rate: float = 0.2
    initial_accumulator_value: float = 1.0
    scale_loss_by_unroll_steps: bool = True
    seed: int = 0
    max_steps: int | None = None
    max_seconds: float | None = None
    log_every: int = 20
    eval_every: int = 0
    checkpoint_every: int = 500
    checkpoint_every_seconds: float | None = 1800.0
    max_to_keep: int = 3
    async_checkpoints: bool | None = None
    nonfinite_skips: int = 3
    eval_batch_size: int = 32
    eval_unroll_steps: int = 20
    mesh_model: int = 0
    softmax: str = "sampled"
    softmax_init: str = "unigram"
    softmax_chunk: int = 16384
    input_workers: int = 0
    decide_every: int = 10
    transfer_guard: str = "allow"
    profile_steps: str | None = None
    scan_unroll: int = 1
    compute_dtype: str = "float32"

    @property
    def dtype(self):
        import jax.numpy as jnp  # here: reading a config needs no jax (`train.py --help`)

        return jnp.dtype(self.compute_dtype)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What to train on (the "data" section).

    Attributes:
        train_files: a glob of sentence-per-line text files (local or in a
            bucket), or a folder prepared by `train.py prepare`.
        vocab_file: bilm-tf's vocabulary (one word a line, most frequent
            first, with <S>, </S> and <UNK>; `train.py vocab` counts one).
        eval_files: a glob of held-out files for perplexity.
        source: "text" (the default: train_files) or "lm1b" (TensorFlow
            Datasets' One Billion Word Benchmark).
        init_from: fine-tune from a weights.hdf5 (options.json beside it),
            an export folder, a training workdir or a published model's name.
        tokenize: "en" or "zh": the files are raw lines, tokenised once
            (Moses, or jieba's Chinese segmentation) and cached.
    """
    train_files: str | None = None
    vocab_file: str | None = None
    eval_files: str | None = None
    source: str = "text"
    init_from: str | None = None
    tokenize: str | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    """A run: the model's options, how to train, what to train on.

    Attributes:
        model: bilm-tf's options (the "model" section, options.json unchanged).
        train: how to train.
        data: what to train on.
        description: a line that says what the run is for.
    """
    model: ElmoOptions
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    description: str = ""

    def to_dict(self) -> dict:
        return {"description": self.description, "model": self.model.to_dict(),
                "train": dataclasses.asdict(self.train), "data": dataclasses.asdict(self.data)}

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


def _section(klass, d, name):
    if not isinstance(d, dict):
        raise ConfigError(f"'{name}' must be an object, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(klass)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"unknown field '{name}.{unknown[0]}' (known: {', '.join(sorted(names))})")
    return klass(**d)


def config_from_dict(d: dict) -> Config:
    """A config dict (or a bare options.json dict) -> Config."""
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a JSON object, got {type(d).__name__}")
    if "lstm" in d and "char_cnn" in d:   # a bilm-tf options.json on its own
        d = {"model": d}
    unknown = sorted(set(d) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section '{unknown[0]}': a config has {', '.join(SECTIONS)}")
    if "model" not in d:
        raise ConfigError("the 'model' section (bilm-tf's options.json) is missing")
    try:
        model = ElmoOptions.from_dict(d["model"])
    except OptionsError as e:
        raise ConfigError(f"model: {e}") from None
    data = _section(DataConfig, d.get("data", {}), "data")
    if data.source not in ("text", "lm1b"):
        raise ConfigError(f"'data.source' must be 'text' or 'lm1b', got {data.source!r}")
    if data.tokenize not in (None, "en", "zh"):
        raise ConfigError(f"'data.tokenize' must be 'en', 'zh' or null, got {data.tokenize!r}")
    train = _section(TrainConfig, d.get("train", {}), "train")
    if train.softmax not in ("sampled", "full"):
        raise ConfigError(f"'train.softmax' must be 'sampled' or 'full', got {train.softmax!r}")
    if train.transfer_guard not in TRANSFER_GUARDS:
        raise ConfigError(f"'train.transfer_guard' must be one of {', '.join(TRANSFER_GUARDS)}, "
                          f"got {train.transfer_guard!r}")
    profile_window(train.profile_steps)
    if train.softmax_init not in SOFTMAX_INITS:
        raise ConfigError(f"'train.softmax_init' must be one of {', '.join(SOFTMAX_INITS)}, "
                          f"got {train.softmax_init!r}")
    if model.sample_softmax is False:  # bilm-tf's sample_softmax: false asks for the full one
        if d.get("train", {}).get("softmax", "full") != "full":
            raise ConfigError("model.sample_softmax is false (bilm-tf's option) but "
                              "train.softmax is 'sampled': set only one")
        train = dataclasses.replace(train, softmax="full")
    if model.learning_rate is not None:  # bilm-tf's own option is honoured
        stated = d.get("train", {}).get("learning_rate")
        if stated is not None and stated != model.learning_rate:
            raise ConfigError(f"model.learning_rate ({model.learning_rate}, bilm-tf's option) and "
                              f"train.learning_rate ({stated}) disagree: set only one")
        train = dataclasses.replace(train, learning_rate=model.learning_rate)
    check_ranges(train)
    check_paths(data)
    return Config(model=model, train=train, data=data, description=d.get("description", ""))


def check_paths(data: DataConfig) -> None:
    """Every path of the data section is local, gs:// or s3:// (`paths`), or
    one ConfigError a line each; `init_from` may also be a URL or a name."""
    from elmo_jax import errors
    from elmo_jax.storage import paths
    bad = []
    for name in ("train_files", "eval_files", "vocab_file", "init_from"):
        value = getattr(data, name)
        if value is None or (name == "init_from" and paths.is_url(value)):
            continue
        try:
            paths.check(value)
        except errors.PathError as e:
            bad.append(f"data.{name}: {e}")
    if bad:
        raise ConfigError("\n".join(bad))


# (field, the smallest value it takes, whether that value itself is allowed,
# what the bound means); None fields are "off" and not checked
_RANGES = [
    ("learning_rate", 0, True, "a negative rate climbs the loss"),
    ("initial_accumulator_value", 0, False, "Adagrad divides by its square root"),
    ("max_steps", 1, True, "a run of no steps does nothing; leave it out for no limit"),
    ("max_seconds", 0, False, "leave it out for no time limit"),
    ("log_every", 1, True, "steps between log records"),
    ("eval_every", 0, True, "0 evaluates at the end only"),
    ("checkpoint_every", 1, True, "steps between checkpoints"),
    ("checkpoint_every_seconds", 0, False, "null turns timed saves off"),
    ("max_to_keep", 1, True, "with none kept a rerun would start again from step 0"),
    ("nonfinite_skips", 0, True, "0 stops at the first non-finite loss"),
    ("eval_batch_size", 1, True, "held-out streams"),
    ("eval_unroll_steps", 1, True, "held-out window length"),
    ("mesh_model", 0, True, "0 chooses by the vocabulary's size"),
    ("softmax_chunk", 1, True, "vocabulary rows per chunk"),
    ("input_workers", 0, True, "0 makes batches in the training process"),
    ("decide_every", 1, True, "steps between looking up an agreed stop"),
    ("scan_unroll", 1, True, "LSTM steps per scan iteration"),
]
COMPUTE_DTYPES = ("float32", "bfloat16")


def check_ranges(train: TrainConfig) -> None:
    """Every train setting in its valid range, or one ConfigError listing each
    one out of range (a line each), before anything is compiled or written."""
    bad = []
    for name, low, inclusive, why in _RANGES:
        value = getattr(train, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad.append(f"'train.{name}' must be a number, got {value!r}")
        elif value < low or (value == low and not inclusive):
            bound = f">= {low}" if inclusive else f"> {low}"
            bad.append(f"'train.{name}' must be {bound} ({why}), got {value!r}")
    if train.compute_dtype not in COMPUTE_DTYPES:
        bad.append(f"'train.compute_dtype' must be one of {', '.join(COMPUTE_DTYPES)}, "
                   f"got {train.compute_dtype!r}")
    if bad:
        raise ConfigError("\n".join(bad))


TRANSFER_GUARDS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")


def profile_window(text: str | None) -> tuple[int, int] | None:
    """train.profile_steps "A:B" -> (A, B), the first and last step traced."""
    if not text:
        return None
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ConfigError(f"'train.profile_steps' is A:B (the first and last step traced), "
                          f"got {text!r}") from None
    if not 1 <= a <= b:
        raise ConfigError(f"'train.profile_steps' {text!r}: need 1 <= A <= B")
    return a, b


def parse_override(text: str) -> tuple[list[str], object]:
    """'train.learning_rate=0.1' -> (['train', 'learning_rate'], 0.1)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"an override is PATH=VALUE (e.g. train.learning_rate=0.1), got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(d: dict, overrides: Sequence[str]) -> dict:
    """A copy of the config dict `d` with each PATH=VALUE set."""
    d = copy.deepcopy(d)
    if "lstm" in d and "char_cnn" in d:
        d = {"model": d}
    for text in overrides:
        path, value = parse_override(text)
        if path[0] not in SECTIONS[1:]:
            raise ConfigError(f"override {text!r}: the path starts with model, train or data")
        node = d
        for k in path[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: '{k}' is not an object")
        node[path[-1]] = value
    return d


PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def config_path(name: str | os.PathLike) -> str:
    """A config file's path; a bare name (`tiny`, `original`) is one of the
    configs shipped in the package (`configs/` in a checkout)."""
    path = os.fspath(name)
    if not os.path.exists(path) and os.sep not in path and not path.endswith(".json"):
        packaged = os.path.join(PACKAGED, f"{path}.json")
        if os.path.exists(packaged):
            return packaged
    return path


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Read a run's config.

    Args:
        path: a config file, a bare bilm-tf options.json (default training
            settings), or a shipped config's name ("tiny", "original").
        overrides: "section.field=value" strings (`--set`), the value read
            as JSON when it parses.

    Returns:
        The `Config`.

    Raises:
        ConfigError: a missing file, an unknown field or a value out of
            range; every such line at once, each naming the file and field.
    """
    path = config_path(path)
    d = read_json(path, "config file", ConfigError)
    try:
        return config_from_dict(apply_overrides(d, overrides))
    except (ConfigError, TypeError) as e:
        raise ConfigError("\n".join(f"{path}: {line}" for line in str(e).splitlines())) from None


def save_config(config: Config, path: str | os.PathLike) -> None:
    write_json(path, config.to_dict())


def field_help(path: str) -> tuple[str, type]:
    """(what the field means, the type its flag parses) of a config field
    "section.name" (model.*: an `ElmoOptions` field), read from the section's
    dataclass: its docstring's `Attributes:` entry and its annotation, so that
    the commands' flags say what the config says.

    Raises:
        KeyError: no such field.
    """
    section, name = path.split(".", 1)
    cls = {"model": ElmoOptions, "train": TrainConfig, "data": DataConfig}[section]
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    kind = str(field.type)
    parse = int if kind.startswith("int") else float if kind.startswith("float") else str
    doc = (cls.__doc__ or "").split("Attributes:", 1)[-1].splitlines()
    text, inside = [], False
    for line in doc:
        stripped = line.strip()
        if stripped.startswith(f"{name}:"):
            text, inside = [stripped[len(name) + 1:].strip()], True
        elif inside and line.startswith(" " * 12) and stripped:
            text.append(stripped)
        elif inside:
            break
    return " ".join(text), parse
