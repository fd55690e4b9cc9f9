"""Transparent huge pages for XLA's CPU buffers, set before a command computes.

XLA:CPU allocates a step's temporaries as one block (110 MB for
`bilm-tf-small`, 2.9 GB for `original`) with posix_memalign from a worker
thread's arena; glibc serves a block that large with a fresh mmap and unmaps it
when the step ends, so every step faults its temporaries in again, 4 KiB at a
time: 28k page faults per `bilm-tf-small` step (a fifth of its CPU time in the
kernel), 730k per `original` step. glibc's `hugetlb` tunable has it advise
those mappings as transparent huge pages, 2 MiB each: 100-200x fewer faults,
training steps 12-22% and embed passes 16-21% faster on this machine
(BENCHMARKS.md, "The means, measured").

glibc reads GLIBC_TUNABLES only when a process starts, so a command sets it by
executing itself again, once, as its first act (same pid, arguments and
environment otherwise). ELMO_JAX_DEFAULT_MALLOC=1 turns this off; a library
user gets the same by starting Python with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1.
"""
from __future__ import annotations

import os
import sys

from elmo_jax import environment

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = environment.DEFAULT_MALLOC


def tuned_environment(env: dict) -> dict | None:
    """`env` with TUNABLE added to GLIBC_TUNABLES, or None when it needs no
    change: the tunable (or any hugetlb setting) is there already, or `env`
    opts out."""
    if not environment.huge_pages_wanted(env):
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if any(t.split("=")[0] == "glibc.malloc.hugetlb" for t in tunables.split(":")):
        return None
    return dict(env, GLIBC_TUNABLES=":".join(filter(None, [tunables, TUNABLE])))


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):
        return False


def reexec_with_huge_pages() -> None:
    """Execute this process again with TUNABLE set; returns at once when it is
    set already, the user opted out, this is not glibc on Linux, or the
    program came from standard input (which cannot be read twice)."""
    env = tuned_environment(dict(os.environ))
    argv = list(getattr(sys, "orig_argv", []))
    if env is None or sys.platform != "linux" or not _glibc() or argv[1:2] in ([], ["-"]):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
