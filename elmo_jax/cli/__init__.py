"""The command-line tools: `elmo-jax train|eval|export|vocab|prepare|score|plan|embed|models`
(installed with the package; `train.py` and `embed.py` in a checkout are the
same commands). What they share: bad input is a one-line error."""
from __future__ import annotations

import sys

from elmo_jax.cli.process import run_cli

__all__ = ["main", "run_cli", "train_command", "embed_command"]


COMMANDS = {"train": "train", "eval": "train", "export": "train", "vocab": "train",
            "score": "train", "plan": "train", "prepare": "train", "embed": "embed",
            "models": "models"}


def main(argv=None) -> None:
    """`elmo-jax COMMAND ...`: dispatch to the command's own parser."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print("usage: elmo-jax {" + ",".join(COMMANDS) + "} ...  (elmo-jax COMMAND --help)",
              file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    prog = f"elmo-jax {command}"
    if COMMANDS[command] == "embed":
        from elmo_jax.cli import embed as module
    elif COMMANDS[command] == "models":
        from elmo_jax.cli import models as module
    else:
        from elmo_jax.cli import train as module
        if command != "train":  # train's subcommands name themselves
            rest, prog = [command] + rest, "elmo-jax"
    run_cli(lambda: module.main(rest, prog=prog))


def train_command() -> None:
    """`elmo-jax-train`: the same as `elmo-jax train` (and `python train.py`)."""
    from elmo_jax.cli import train

    run_cli(train.main)


def embed_command() -> None:
    """`elmo-jax-embed`: the same as `elmo-jax embed` (and `python embed.py`)."""
    from elmo_jax.cli import embed

    run_cli(embed.main)
