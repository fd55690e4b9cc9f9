"""What the commands set up in their own process, and the library never
does: JAX's persistent compilation cache (a restarted run, training or a
corpus job, reaches its first step without compiling again, and the two share
it). Signals, huge pages and supervision are the commands' too
(`training/stopping.catch_signals_now`, `huge_pages.py`, `supervise.py`)."""
from __future__ import annotations

import os


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
