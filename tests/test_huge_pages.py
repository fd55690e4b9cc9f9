"""Huge pages for XLA's CPU buffers (elmo_jax/cli/huge_pages.py): the commands
execute themselves once with glibc's hugetlb tunable, and the tunable does
what it is there for, fewer page faults on a large fresh block."""
import os
import subprocess
import sys

import pytest

from elmo_jax.cli.huge_pages import OPT_OUT, TUNABLE, tuned_environment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tuned_environment_adds_the_tunable_once_and_keeps_the_users():
    assert tuned_environment({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": TUNABLE}
    other = "glibc.malloc.arena_max=2"
    assert tuned_environment({"GLIBC_TUNABLES": other})["GLIBC_TUNABLES"] == f"{other}:{TUNABLE}"
    assert tuned_environment({"GLIBC_TUNABLES": f"{other}:glibc.malloc.hugetlb=0"}) is None
    assert tuned_environment({"GLIBC_TUNABLES": TUNABLE}) is None
    assert tuned_environment({OPT_OUT: "1"}) is None
    assert tuned_environment({OPT_OUT: "0"})["GLIBC_TUNABLES"] == TUNABLE


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    return dict(env, **extra)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables: Linux only")
def test_a_command_runs_once_with_the_tunable_set():
    code = ("import os, sys; from elmo_jax.cli import run_cli; "
            "run_cli(lambda: print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:]) or 0)")
    for env, expected in ((_clean_env(), TUNABLE), (_clean_env(**{OPT_OUT: "1"}), "None")):
        r = subprocess.run([sys.executable, "-c", code, "a b", "--flag"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"{expected} ['a b', '--flag']"]


def test_the_commands_can_set_it_before_jax_is_imported():
    """The re-execution comes first: importing the package and its commands
    loads none of the heavy libraries (each would be loaded twice)."""
    code = ("import sys, elmo_jax, elmo_jax.cli, elmo_jax.cli.train, elmo_jax.cli.embed; "
            "print(sorted(m for m in ('jax', 'flax', 'orbax', 'h5py', 'optax') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


# a fresh 256 MiB block from glibc's posix_memalign, as XLA:CPU allocates
# its buffers, touched once (numpy would not do: it advises huge pages itself)
FAULTS = """
import ctypes, resource
libc = ctypes.CDLL("libc.so.6")
size, block = 256 << 20, ctypes.c_void_p()
assert libc.posix_memalign(ctypes.byref(block), 64, ctypes.c_size_t(size)) == 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(block, 1, size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _thp_available() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            return "[never]" not in fh.read()
    except OSError:
        return False


@pytest.mark.skipif(not _thp_available(), reason="no transparent huge pages on this kernel")
def test_the_tunable_cuts_the_page_faults_of_a_large_fresh_block():
    faults = {}
    for name, env in (("default", _clean_env()), ("tuned", _clean_env(GLIBC_TUNABLES=TUNABLE))):
        r = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        faults[name] = int(r.stdout.split()[-1])
    assert faults["default"] >= (256 << 20) // 4096 * 0.9  # one per 4 KiB page
    assert faults["tuned"] < faults["default"] / 20, faults
