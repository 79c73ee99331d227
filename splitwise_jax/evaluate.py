"""`python -m splitwise_jax.evaluate`: predict one cluster's latency, SLOs, power and cost.

The entry point only; the arguments and the run live in `splitwise_jax.cli.evaluate`
(see its docstring for examples).

This module shares its name with the model function `splitwise_jax.evaluate`, which
importing it leaves in place (see the package's `__init__`); reach the command line
with ``from splitwise_jax.evaluate import main``.
"""

from splitwise_jax.cli.evaluate import build_parser as build_parser
from splitwise_jax.cli.evaluate import format_table as format_table
from splitwise_jax.cli.evaluate import main as main
from splitwise_jax.cli.evaluate import metrics_to_dict as metrics_to_dict
from splitwise_jax.cli.evaluate import status_words as status_words

if __name__ == "__main__":
    from splitwise_jax.cli._cli import run

    run(main)
