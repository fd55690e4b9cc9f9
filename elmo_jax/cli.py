"""What every command-line entry point shares: bad input is a one-line error."""
from __future__ import annotations

import json
import sys

from elmo_jax.config import ConfigError
from elmo_jax.data import DataError
from elmo_jax.options import OptionsError
from elmo_jax.vocab import VocabError
from elmo_jax.weights import WeightsError


def run_cli(main) -> None:
    """Run `main()`; a user error prints `error: ...` and exits with status 2."""
    from elmo_jax.training import TrainingError

    try:
        sys.exit(main())
    except (ConfigError, DataError, OptionsError, VocabError, WeightsError, TrainingError,
            FileNotFoundError, UnicodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def print_result(result: dict, out: str | None = None) -> None:
    """Print a result as one JSON line; with `out`, also append it there."""
    line = json.dumps(result)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    print(line)
