"""What a training process and its supervising parent (`cli/supervise.py`)
share: the parent names a file in the child's environment, where the child's
watcher (`training/pod.py`) writes down each second whom it last heard, and
beside which it leaves a mark once every process has finished. Constants
only: the parent imports nothing heavy."""

PEERS_FILE_ENV = "ELMO_JAX_PEERS_FILE"  # where the child's watcher says whom it last heard
FINISHED_SUFFIX = ".finished"  # PEERS_FILE + this: every process got to the end
