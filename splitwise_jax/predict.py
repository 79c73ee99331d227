"""`python -m splitwise_jax.predict`: profile-style prompt and token times (or, with
--benchmarks, a serving-benchmark table's percentiles).

The entry point only; the arguments and the run live in `splitwise_jax.cli.predict`
(see its docstring), the queries' check and prediction in
`splitwise_jax.calibrate.queries`, re-exported here for the callers of
``splitwise_jax.predict.predict_queries``.
"""

from splitwise_jax.calibrate.queries import QUERY_COLUMNS as QUERY_COLUMNS
from splitwise_jax.calibrate.queries import predict_queries as predict_queries
from splitwise_jax.calibrate.queries import validate_queries as validate_queries
from splitwise_jax.cli.predict import build_parser as build_parser
from splitwise_jax.cli.predict import main as main

if __name__ == "__main__":
    from splitwise_jax.cli._cli import run

    run(main)
