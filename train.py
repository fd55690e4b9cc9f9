"""Pretrain, evaluate, export and score an ELMo biLM: `python train.py --help`.
The command lives in elmo_jax/cli/train.py (installed: `elmo-jax train`)."""
from elmo_jax.cli import run_cli
from elmo_jax.cli.train import main

if __name__ == "__main__":
    run_cli(main)
