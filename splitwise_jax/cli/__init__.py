"""The edge: command lines.

`_cli` (the precision policy and exit style every command line shares),
`_design_args` (the design arguments of evaluate, optimize and simulate), `evaluate`
(``python -m splitwise_jax.evaluate``; the entry module of that name calls `main`
here). See docs/architecture.md.
"""
