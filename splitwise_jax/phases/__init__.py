"""Layer 2, phases: one machine running one iteration, as smooth JAX functions.

`phases` (prompt/token/mixed iteration latency), `memory` (weights and KV cache),
`power`, `kv_transfer`, `params` (the calibration parameters and their file),
`param_space` (their fit space), `timing` (a machine's phase timing strategies),
`sim_table` and `profiles` (SplitwiseSim's interpolated table and the measured profiles
it reads), `provenance` (where a GPU's parameters come from), `_caps` (power-cap
bounds). Imports only specs and the private utilities. See docs/architecture.md.
"""
