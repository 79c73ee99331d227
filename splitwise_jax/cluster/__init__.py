"""Layer 3, cluster: pools of machines under a workload, the fluid/queueing model.

The designs are strategy objects (`strategy.DesignStrategy`; the registry
`strategies.STRATEGIES`): `flows_baseline` (the paper's baselines), `flows_splitwise`
(Splitwise and its mixed pool), `chunked` (chunked prefill), `engine` (the serving
engine, per load stage). `cluster` holds `Cluster` and `evaluate`, whose stages are
`components` (latency mixtures), `window` (a trace's windows and backlog), `totals`
(throughput, power, cost) and `metrics` (`ClusterMetrics`, status bits, percentile
labels). Below them: `types` (routes and flows), `pool`, `queueing`, `percentiles`,
`quantiles` (pool states, waits and latency percentiles); beside them `designs` (the
paper's designs and `make_cluster`) and `workload` (request-size distributions and
traces). Imports only phases, specs and the private utilities. See
docs/architecture.md.
"""
