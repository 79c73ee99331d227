"""The edge: command lines.

`_cli` (the precision policy and exit style every command line shares),
`_design_args` (the design, model and workload arguments of evaluate, optimize and
simulate: one grammar), `evaluate` (``python -m splitwise_jax.evaluate``), `predict`
(``python -m splitwise_jax.predict``; the entry modules of those names call `main`
here), `serving` (calibrate/predict ``--benchmarks``). See docs/architecture.md.
"""
