"""What the commands set up in their own process, and the library never
does: `run_cli` (huge pages, the library's messages as lines on stderr, a
user's error as one line and status 2) and JAX's persistent compilation cache
(a restarted run, training or a corpus job, reaches its first step without
compiling again, and the two share it). Signals and supervision are the
commands' too (`training/stopping.catch_signals_now`, `cli/supervise.py`)."""
from __future__ import annotations

import os
import sys

from elmo_jax.cli.huge_pages import reexec_with_huge_pages


def use_compilation_cache() -> str:
    """JAX's compilation cache in `$JAX_COMPILATION_CACHE_DIR` (or one set in
    jax's config) if the user chose one, else `$ELMO_JAX_CACHE/xla` (a bucket
    prefix too: a pod's hosts share it); the key of CPU programs made the same
    on every process (`private_apis`). Returns the folder."""
    import jax

    from elmo_jax import private_apis
    from elmo_jax.formats import downloads
    from elmo_jax.storage import paths

    private_apis.one_cache_key_for_every_process()
    chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if chosen:
        return paths.check(chosen)  # a bucket is fine (JAX writes it through etils' epath)
    shared = downloads.shared_cache()
    folder = paths.join(shared, "xla") if shared else os.path.join(downloads.cache_dir(), "xla")
    jax.config.update("jax_compilation_cache_dir", folder)
    return folder


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
