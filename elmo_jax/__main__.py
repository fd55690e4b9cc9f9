"""`python -m elmo_jax COMMAND ...`: the same as the installed `elmo-jax`."""
from elmo_jax.cli import main

main()
