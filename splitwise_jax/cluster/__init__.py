"""Layer 3, cluster: pools of machines under a workload, the fluid/queueing model.

`types` (the cluster's data types), `cluster` (`evaluate`), `chunked` (chunked-prefill
scheduling), `pool`, `queueing`, `percentiles`, `quantiles` (pool states, waits and
latency percentiles), `designs` (the paper's designs and `make_cluster`), `workload`
(request-size distributions and traces). Imports only phases, specs and the private
utilities. See docs/architecture.md.
"""
