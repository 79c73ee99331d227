"""What a cluster design is to the model: a small strategy object the `Cluster` carries.

A design's flow model (who runs where: each pool's steady state and each route's share,
`types.Flows`) is the one thing the designs do differently; the stages around it
(request classes, the trace's window loads and backlog, latency components, quantiles,
throughput/power/cost, status) are shared. Each design is a `DesignStrategy`: a
stateless, hashable singleton, kept as a static field of the `Cluster` pytree
(`Cluster.strategy`), so that `jit`, `vmap` and `grad` see it as they saw the old
`kind` string: one compiled program per design, shared by every cluster of it.

The designs (registry: `strategies.STRATEGIES`, by `kind`):

| kind      | strategy                           | pools               | flows                        |
|-----------|------------------------------------|---------------------|------------------------------|
| baseline  | `flows_baseline.Baseline`          | colocated           | whole prompts, mixed batches |
| chunked   | `chunked.Chunked`                  | colocated           | chunked prefill              |
| splitwise | `flows_splitwise.Splitwise`        | prompt, token       | phase split, mixed pool      |
| engine    | `engine.ServingEngine`             | colocated (1 server)| per load stage (`stage_metrics`) |

Where to add a design: one new module with a `DesignStrategy` subclass (its `flows`,
and the hooks below where it differs from a colocated pool), one line in
`strategies.STRATEGIES` (docs/architecture.md, "Where to add a design"). Nothing else
names a design: evaluate, optimize and the simulator ask its strategy (`token_pool`,
`simulated_as_is`, `simulated`, `describe`, ...), and tests/test_strategies.py fails on
a comparison of a `kind` with a design's name outside this module and the registry.
"""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp


class DesignStrategy:
    """A design's flow model and the facts about it that callers ask for.

    Subclasses set the class attributes and implement `flows`; the hooks have the
    colocated pool's behaviour by default (one pool whose machines run both phases).
    Instances carry no data: equal (and equally hashed) when of the same class, so any
    two `Cluster`s of one design share a tree structure and a compiled program.

    Attributes:
        kind: the design's name in design files, the CLI and JSON outputs ("baseline",
            "chunked", "splitwise", "engine"; `Cluster.kind`, `Design.kind`).
        roles: the pool roles of its clusters, in `Cluster` slot order (the first pool is
            the `prompt` slot): ("colocated",) or ("prompt", "token").
        label: how messages name it ("a baseline", ...).
        simulated_as_is: whether the request-level simulator runs its clusters as they
            are (`simulated` returns them unchanged, with no options of its own).
    """

    __slots__ = ()
    kind: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ("colocated",)
    label: ClassVar[str] = ""
    simulated_as_is: ClassVar[bool] = True

    # -- identity: a hashable singleton, static pytree metadata ---------------------
    def __eq__(self, other) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash((type(self).__module__, type(self).__qualname__))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self):
        return (type(self), ())

    @property
    def token_pool(self) -> bool:
        """Whether its clusters have a token pool (sized by `Cluster.n_token`)."""
        return "token" in self.roles

    # -- the flow model -------------------------------------------------------------
    def flows(self, cluster, cls, rate, ca2, horizon_s, res, window_s=None):
        """The design's flows (`types.Flows`) at arrival rate `rate` (req/s), arrival
        variability `ca2` (a scalar SCV or a `queueing.Burstiness`) over a window of
        `horizon_s` seconds; `cls` the request classes (`types.Classes`), `res` the
        numerical resolution (`percentiles.Resolution`); `window_s` the length of the
        whole run, which starts empty (the decoding population's window,
        `pool.window_share`; None: stationary)."""
        raise NotImplementedError(f"{type(self).__name__} has no cluster flow model")

    def check(self, cluster) -> None:
        """Raise ValueError for a `Cluster` this design cannot evaluate (structural: run
        on static data before tracing)."""

    # -- what the trace's window code asks of the design (`window`) -----------------
    def window_load(self, cluster, cls, rate, flows):
        """(prompt load per prompt machine were the pool to take every prompt, the pool's
        drain capacity once drafting starts, in prompt machines) in one window."""
        return flows.st_p.rho_prompt, jnp.ones_like(flows.st_p.rho_prompt)

    def on_prompt_machines(self, flows, state) -> bool:
        """Whether the decode route with this pool state runs on prompt machines (whose
        decoders sit through the prompt queue's backlog)."""
        return state is flows.st_p

    def run_whole(self, decode_routes, share):
        """The decode routes when a `share` of requests runs wholly on its prompt's
        machine (past every drafting threshold); a colocated design does already."""
        return decode_routes

    # -- what the request-level simulator asks (`simulate.policies.simulated`) ------
    def simulated(self, cluster) -> tuple:
        """What the request-level simulator runs for a cluster of this design: (the
        cluster its machines run, the `simulate.SimConfig` fields the design sets, a dict
        of field -> value). The simulator runs a cluster's pools by their roles (a token
        pool: the prompt and token machines with the mixed pool's scheduler; none: one
        colocated pool routed by fewest pending tokens); a design that is a policy of the
        simulated machines rather than of the cluster's timing (chunked prefill) returns
        the cluster it runs as and the policy's options, and sets `simulated_as_is`
        False. ValueError where the simulator cannot run it (a fractional budget)."""
        return cluster, {}

    # -- building and naming --------------------------------------------------------
    def pools(self, cluster) -> tuple:
        """(role, timing, count) of each pool of a built cluster, in `roles` order."""
        return (("colocated", cluster.prompt, cluster.n_prompt),)

    def scheduling(self, sched, design):
        """The `Cluster.scheduling` this design runs `design.scheduling` as."""
        return sched

    def describe(self, design) -> str:
        """What to add to a design's one-line title (", chunked prefill 512 tokens")."""
        return ""


class Colocated(DesignStrategy):
    """A colocated design: one pool (the `Cluster`'s prompt slot), every machine running
    both phases, requests routed to the machine with the fewest pending tokens. The hooks
    of `DesignStrategy` are a colocated pool's; the baselines (`flows_baseline.Baseline`)
    and chunked prefill (`chunked.Chunked`) differ in their flows only."""

    __slots__ = ()
    roles: ClassVar[tuple[str, ...]] = ("colocated",)
