"""The process-level environment variables that elmo-jax reads, each read
here and nowhere else; `VARIABLES` is the table the docs print
(docs/reference/environment.md). Everything a run does otherwise is in its
config (`config.py`); these are what belongs to the machine or the process:
where the cache is, whether the network may be used, how long an outage is
waited out. Imports nothing: the jax-free supervising parent reads it too."""
from __future__ import annotations

import os

CACHE = "ELMO_JAX_CACHE"
OFFLINE = "ELMO_JAX_OFFLINE"
ENDPOINT = "ELMO_JAX_ENDPOINT"
STORAGE_RETRY_SECONDS = "ELMO_JAX_STORAGE_RETRY_SECONDS"
ACCELERATORS = "ELMO_JAX_ACCELERATORS"
DEFAULT_MALLOC = "ELMO_JAX_DEFAULT_MALLOC"
SUPERVISED = "ELMO_JAX_SUPERVISED"
PEERS_FILE = "ELMO_JAX_PEERS_FILE"
FINISHED_SUFFIX = ".finished"  # PEERS_FILE + this: every process got to the end

# name: (default, meaning): the table of docs/reference/environment.md
VARIABLES = {
    CACHE: ("${XDG_CACHE_HOME:-~/.cache}/elmo-jax",
            "the cache of downloaded models, corpora, local copies of bucket objects "
            "and JAX's compiled programs (`xla/`); a `gs://` or `s3://` prefix is a "
            "cache that a pod's hosts share (local copies then go to the default)"),
    OFFLINE: ("unset", "`1`: use the cache only and name what is missing (so does "
                       "`HF_HUB_OFFLINE=1`)"),
    ENDPOINT: ("unset", "`http://host:port`: fetch every published model from this "
                        "mirror, same paths"),
    STORAGE_RETRY_SECONDS: ("300", "how long a write to a bucket is tried again while "
                                   "the storage service fails, beyond the clients' own "
                                   "retries"),
    ACCELERATORS: ("`.venv/accelerators` of the checkout",
                   "where `make` installed the TPU and GPU compilers that `plan` uses"),
    DEFAULT_MALLOC: ("unset", "`1`: the commands do not re-execute themselves with "
                              "glibc's huge pages"),
    SUPERVISED: ("set by the command", "internal: this process is the supervised child "
                                       "of a run of several processes"),
    PEERS_FILE: ("set by the command", "internal: where the supervised child writes "
                                       "whom it last heard from"),
}

_TRUE = ("1", "true", "yes", "on")


def cache_setting() -> str | None:
    """`$ELMO_JAX_CACHE` as given (a local folder or a bucket prefix), or None."""
    return os.environ.get(CACHE) or None


def offline() -> bool:
    """Whether downloads are off (`ELMO_JAX_OFFLINE` or `HF_HUB_OFFLINE`)."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in (OFFLINE, "HF_HUB_OFFLINE"))


def endpoint() -> str | None:
    """`$ELMO_JAX_ENDPOINT`: the mirror published models are fetched from, or None."""
    return os.environ.get(ENDPOINT) or None


def storage_retry_seconds(default: float) -> float:
    """`$ELMO_JAX_STORAGE_RETRY_SECONDS` as a number of seconds (>= 0), else `default`.

    Raises:
        ValueError: the variable is not a number (the caller words the error).
    """
    return max(0.0, float(os.environ.get(STORAGE_RETRY_SECONDS, default)))


def accelerators_dir(checkout: str) -> str:
    """`$ELMO_JAX_ACCELERATORS`, else the checkout's `.venv/accelerators`."""
    return os.environ.get(ACCELERATORS) or os.path.join(checkout, ".venv", "accelerators")


def huge_pages_wanted(env: dict) -> bool:
    """False when `ELMO_JAX_DEFAULT_MALLOC` is set to anything but "0" in `env`."""
    return env.get(DEFAULT_MALLOC, "") in ("", "0")


def supervised() -> bool:
    """Whether this process is the supervised child of a run of several."""
    return bool(os.environ.get(SUPERVISED))


def peers_file() -> str | None:
    """Where the supervised child writes whom it last heard (None unsupervised)."""
    return os.environ.get(PEERS_FILE) or None
