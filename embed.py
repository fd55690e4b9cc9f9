"""Embed a text file with ELMo: `python embed.py --help`. The command lives in
elmo_jax/cli/embed.py (installed: `elmo-jax embed`)."""
from elmo_jax.cli import run_cli
from elmo_jax.cli.embed import main

if __name__ == "__main__":
    run_cli(main)
