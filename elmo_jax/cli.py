"""What every command-line entry point shares: bad input is a one-line error."""
from __future__ import annotations

import sys

from elmo_jax.data import DataError
from elmo_jax.options import OptionsError
from elmo_jax.vocab import VocabError
from elmo_jax.weights import WeightsError


def run_cli(main) -> None:
    """Run `main()`; a user error prints `error: ...` and exits with status 2."""
    from elmo_jax.training import TrainingError

    try:
        sys.exit(main())
    except (DataError, OptionsError, VocabError, WeightsError, TrainingError,
            FileNotFoundError, UnicodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
