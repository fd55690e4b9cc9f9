"""The command-line tools: `elmo-jax train|eval|export|vocab|prepare|score|plan|embed|models`
(installed with the package; `train.py` and `embed.py` in a checkout are the
same commands). What they share: bad input is a one-line error."""
from __future__ import annotations

import os
import sys

from elmo_jax.cli.huge_pages import reexec_with_huge_pages


def run_cli(main) -> None:
    """Run `main()` in a process with huge pages for XLA's buffers (huge_pages.py:
    set before JAX is imported, which this module does not do); a user error
    (`errors.UserError`) prints `error: ...` and exits with status 2; any other
    exception is a bug and keeps its traceback. `--help`, and the parent of a
    run of several processes (`supervise`), never import jax."""
    reexec_with_huge_pages()
    import logging

    # gcsfs logs each request it gives up on with a traceback; the command's
    # error line says what failed and what to do
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    report_library_messages()
    from elmo_jax.errors import StorageError, UserError

    try:
        sys.exit(main())
    except UserError as e:
        for line in str(e).splitlines() or [""]:  # several faults: a line each
            print(f"error: {line}", file=sys.stderr)
        if isinstance(e, StorageError):
            # the storage stopped answering: the clients' background threads
            # (orbax's, TensorStore's) would go on retrying, and logging each
            # try, for minutes at exit; everything elmo-jax keeps is written
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
        sys.exit(2)


def report_library_messages() -> None:
    """The library's reports (the `elmo_jax` loggers, INFO and up) as plain
    lines on stderr, written beside a progress bar without breaking it."""
    import logging

    class Lines(logging.Handler):
        def emit(self, record):
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)

    root = logging.getLogger("elmo_jax")
    if not any(getattr(h, "elmo_jax_lines", False) for h in root.handlers):
        handler = Lines()
        handler.elmo_jax_lines = True
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False  # absl puts a handler on the root logger: not twice


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
