"""`python -m splitwise_jax.optimize` (the arguments and the run live in `cli.py`)."""

from splitwise_jax.optimize.cli import main

if __name__ == "__main__":
    from splitwise_jax.cli._cli import run

    run(main)
