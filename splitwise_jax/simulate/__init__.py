"""A request-level discrete-event simulation of a cluster under the same phase models.

`simulate(cluster, trace)` replays a request trace (a user's CSV with its own arrival
times, or Poisson arrivals sampled from a workload) through the cluster `evaluate`
models, request by request: SplitwiseSim's routing, continuous batching, mixed pool,
KV-memory admission, preemption and KV transfers, timed by the cluster's own timing
strategies. It checks the fluid model on any design, GPU or trace, and gives the
per-request and per-machine detail the fluid model does not.

Modules: `trace` (request traces), `policies` (`SimConfig`), `timing` (fast per-iteration
timing), `engine` (the event loop), `report` (metrics, tables, histograms), `api`
(`simulate`); `python -m splitwise_jax.simulate` is the command line.
"""

from splitwise_jax.simulate import trace as trace
from splitwise_jax.simulate.api import SimResult as SimResult
from splitwise_jax.simulate.api import simulate as simulate
from splitwise_jax.simulate.policies import SimConfig as SimConfig
from splitwise_jax.simulate.trace import RequestTrace as RequestTrace
