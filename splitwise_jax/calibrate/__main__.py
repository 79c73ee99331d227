"""`python -m splitwise_jax.calibrate` (the arguments and the run live in `cli.py`)."""

from splitwise_jax.calibrate.cli import main

if __name__ == "__main__":
    from splitwise_jax.cli._cli import run

    run(main)
