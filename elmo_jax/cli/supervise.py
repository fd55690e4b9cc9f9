"""The parent of each training process of a run of several processes. jax
ends a process from C++ (SIGABRT) as soon as the coordinator (process 0) is
gone, before Python can say a word; this parent, which imports nothing heavy
(no jax: it only waits), turns that into the project's error line. The
child's watcher (`elmo_jax.training.pod`) writes down each second whom it last
heard, and a mark once every process has finished."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from elmo_jax import environment
from elmo_jax.environment import FINISHED_SUFFIX


def supervise(argv: list[str], who: str) -> int:
    """Run the training command `argv` in a child process and return its exit
    status, passing SIGTERM and SIGINT on. jax ends a process from C++
    (SIGABRT) as soon as the coordinator (process 0) is gone, before Python
    can say a word: then this says which process was lost and when it was
    last heard (the child's watcher writes that down each second), and
    returns 2."""
    import tempfile

    fd, peers = tempfile.mkstemp(prefix="elmo-jax-peers-", suffix=".json")
    os.close(fd)
    os.unlink(peers)
    env = dict(os.environ, **{environment.SUPERVISED: "1", environment.PEERS_FILE: peers})
    # a session of its own: a Ctrl-C reaches it once, from here
    # the same command line (a wrapper around train.py included), unless called with other args
    from_command_line = sys.argv[len(sys.argv) - len(argv):] == list(argv)
    own = sys.orig_argv[1:] if from_command_line else ["-m", "elmo_jax.cli.train", *argv]
    # the child starts with SIGINT and SIGTERM blocked (a mask survives exec), so
    # that one sent before it can keep it (`catch_signals_now`) waits, pending;
    # one sent here meanwhile is passed on once the handlers are in place
    signals = (signal.SIGINT, signal.SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        child = subprocess.Popen([sys.executable, *own], env=env, start_new_session=True)
        for sig in signals:
            signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    rc = child.wait()
    try:
        with open(peers) as fh:
            seen = json.load(fh)
        os.unlink(peers)
    except (OSError, ValueError):
        seen = None
    finished = os.path.exists(peers + FINISHED_SUFFIX)  # every process got to the end
    if finished:
        os.unlink(peers + FINISHED_SUFFIX)
    if rc == -signal.SIGABRT and finished:
        return 0  # an abort in jax's teardown, after the whole run (`finish_together`)
    if rc == -signal.SIGABRT:
        last = (f"; it last answered {time.time() - seen['now']:.0f} s before" if seen else "")
        sys.stderr.write(f"error: {seen['who'] if seen else who} stopped: lost the coordinator "
                         f"(process 0): it could no longer be reached, and jax's distributed "
                         f"service ended this process{last}. Resume with the same command on "
                         "every host once process 0's host is back\n")
        return 2
    if rc < 0:
        sys.stderr.write(f"error: {who} was ended by {signal.Signals(-rc).name}\n")
        return 128 - rc
    return rc
