"""Cluster designs as data, built into `Cluster` pytrees.

A design is a set of pools plus the KV link and the scheduler (`Design`). Each pool
(`Pool`) is one machine type, a count, a power cap, a tensor-parallel degree and a role:

* one "colocated" pool: every machine runs both phases; whole prompts with mixed
  batching (kind "baseline", the paper's) or chunked prefill when the design sets a
  token budget (kind "chunked", `chunked.py`);
* a "prompt" and a "token" pool: Splitwise (kind "splitwise").

The pools' roles pick the design's strategy (`Design.strategy`,
`strategies.strategy_of_pools`), which the built `Cluster` carries.

The paper's six designs (`DESIGNS`) and two chunked-prefill designs are presets
(`PRESETS`); a TOML design file (`design_file.load_design`) or CLI pool flags give any
other, with any catalogue or spec-file machine:

| preset          | pools                                            |
|-----------------|--------------------------------------------------|
| baseline-a100   | DGX-A100 colocated (whole prompts, mixed)        |
| baseline-h100   | DGX-H100 colocated (whole prompts, mixed)        |
| splitwise-aa    | DGX-A100 prompt, DGX-A100 token                  |
| splitwise-hh    | DGX-H100 prompt, DGX-H100 token                  |
| splitwise-ha    | DGX-H100 prompt, DGX-A100 token                  |
| splitwise-hhcap | DGX-H100 prompt, DGX-H100 token at 70% cap       |
| chunked-a100    | DGX-A100 colocated, chunked prefill (512 tokens) |
| chunked-h100    | DGX-H100 colocated, chunked prefill (512 tokens) |

Phase timing is either the calibrated smooth model ("calibrated") or SplitwiseSim's
profile table ("splitwise-sim-table", read from the shared profile file). A GPU without
profiles of its own runs on the nearest calibrated GPU's parameters and its own spec
sheet (`provenance.params_for`); `pool_provenance` says which, with the expected error.
The `sim_compat` transfer reproduces the reference simulator's KV transfer (one flow
over a 200 GiB/s link, no set-up cost, cache sized without grouped-query attention).

Tensor parallelism: a pool with tp below its machine's GPU count runs one instance per
tp GPUs; its unit is then the instance (a slice of the machine with its share of the
cost, provisioned and host power, and network links), and its count counts instances.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from splitwise_jax.specs import catalog
from splitwise_jax.phases import kv_transfer, memory
from splitwise_jax.phases._caps import cap_floor_frac
from splitwise_jax._validate import check_choice, check_int, check_positive, check_range
from splitwise_jax.cluster.chunked import DEFAULT_TOKEN_BUDGET
from splitwise_jax.cluster.cluster import Cluster, Scheduling, Transfer
from splitwise_jax.cluster.strategies import strategy_of_pools
from splitwise_jax.cluster.strategy import DesignStrategy
from splitwise_jax.specs.hardware import Machine
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.provenance import Provenance, params_for, provenance
from splitwise_jax.phases.timing import CalibratedTiming, SimTableTiming

ROLES = ("prompt", "token", "colocated")
PHASE_MODELS = ("calibrated", "splitwise-sim-table")
TRANSFER_MODES = ("serialized", "layerwise")
SIM_LINK_BYTES_PER_S = 200 * 2.0**30  # SplitwiseSim's KV link (shared/validation/README.md)
_HARDWARE_OF_MACHINE = {"dgx-a100": "a100-80gb", "dgx-h100": "h100-80gb"}
_SLOWDOWN_REFERENCE = "dgx-a100"  # the paper's slowdowns are against one DGX-A100


@dataclass(frozen=True)
class Pool:
    """One pool of identical machines (host-side data, validated on construction).

    Attributes:
        role: "prompt", "token" or "colocated".
        machine: catalogue (or spec-file) machine name.
        count: machines (instances when tp < GPUs per machine), > 0, continuous; None
            for a pool whose size is left to the optimiser.
        cap_frac: power cap as a fraction of TDP (checked against the GPU's floor when built).
        tp: tensor-parallel degree (None: all GPUs of the machine).
        search_machines: machine types `optimize` may choose from for this pool
            (empty: `machine` only).
    """

    role: str
    machine: str
    count: float | None = None
    cap_frac: float = 1.0
    tp: int | None = None
    search_machines: tuple[str, ...] = ()

    def __post_init__(self):
        check_choice("pool role", self.role, ROLES)
        if not isinstance(self.machine, str) or not self.machine:
            raise ValueError(f"pool machine must be a machine name, got {self.machine!r}")
        if self.count is not None:
            check_positive(f"{self.role} pool count", self.count)
        check_range(f"{self.role} pool cap_frac", self.cap_frac, 1e-9, 1.0)
        if self.tp is not None:
            check_int(f"{self.role} pool tp", self.tp, 1)
        object.__setattr__(self, "search_machines", tuple(self.search_machines))

    @property
    def machines(self) -> tuple[str, ...]:
        """Machine types this pool may take (the first is `machine`)."""
        return self.search_machines or (self.machine,)

    def replace(self, **changes) -> "Pool":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Design:
    """A cluster design: pools, KV link and scheduler.

    Attributes:
        name: label used in outputs.
        pools: one colocated pool, or one prompt and one token pool.
        chunked_prefill_tokens: prompt tokens per iteration of a colocated pool running
            chunked prefill (None: whole prompts, the paper's baselines).
        transfer_mode: "serialized" or "layerwise" KV transfer.
        kv_bandwidth_bytes_per_s: override of the KV link's bandwidth (None: from the
            machines' network and the calibrated efficiency).
        scheduling: scheduler knobs (`cluster.Scheduling`: batch-token limit, drafting
            threshold, memory reserve, service jitter).
    """

    name: str
    pools: tuple[Pool, ...]
    chunked_prefill_tokens: float | None = None
    transfer_mode: str = "serialized"
    kv_bandwidth_bytes_per_s: float | None = None
    scheduling: Scheduling = field(default_factory=Scheduling)

    def __post_init__(self):
        object.__setattr__(self, "pools", tuple(self.pools))
        roles = sorted(p.role for p in self.pools)
        if roles not in (["colocated"], ["prompt", "token"]):
            raise ValueError(f"design {self.name!r}: pools must be one colocated pool, or one prompt and one token "
                             f"pool; got roles {roles or 'none'} (the cluster model has no mixed or multi-pool "
                             "layouts beyond these)")
        check_choice("transfer_mode", self.transfer_mode, TRANSFER_MODES)
        if self.kv_bandwidth_bytes_per_s is not None:
            check_positive("kv_bandwidth_bytes_per_s", self.kv_bandwidth_bytes_per_s)
        if self.chunked_prefill_tokens is not None:
            if roles != ["colocated"]:
                raise ValueError(f"design {self.name!r}: chunked prefill applies to a colocated pool; a Splitwise "
                                 "design runs whole prompts on its prompt pool")
            check_positive("chunked_prefill_tokens", self.chunked_prefill_tokens)

    def pool(self, role: str) -> Pool | None:
        """The pool with this role, or None."""
        return next((p for p in self.pools if p.role == role), None)

    @property
    def strategy(self) -> DesignStrategy:
        """The cluster model's design (`strategy.DesignStrategy`), from the pools' roles
        and the token budget."""
        return strategy_of_pools(tuple(p.role for p in self.pools), self.chunked_prefill_tokens is not None)

    @property
    def kind(self) -> str:
        """"baseline", "chunked" or "splitwise": the strategy's name."""
        return self.strategy.kind

    @property
    def first_pool(self) -> Pool:
        """The prompt pool, or the colocated pool (the Cluster's `prompt` slot)."""
        return self.pool("colocated") or self.pool("prompt")

    # The attributes of the old DesignSpec, kept for callers that read them.
    @property
    def prompt_machine(self) -> str:
        return self.first_pool.machine

    @property
    def token_machine(self) -> str | None:
        t = self.pool("token")
        return None if t is None else t.machine

    @property
    def token_cap_frac(self) -> float:
        t = self.pool("token")
        return 1.0 if t is None else t.cap_frac

    def with_counts(self, first: float | None, token: float | None = None) -> "Design":
        """The same design with pool sizes set (prompt or colocated pool, token pool)."""
        pools = tuple(p.replace(count=token if p.role == "token" else first) for p in self.pools)
        return dataclasses.replace(self, pools=pools)

    def replace(self, **changes) -> "Design":
        return dataclasses.replace(self, **changes)


def _colocated(name: str, machine: str, chunked: float | None = None) -> Design:
    return Design(name, (Pool("colocated", machine),), chunked_prefill_tokens=chunked)


def _split(name: str, prompt: str, token: str, token_cap: float = 1.0) -> Design:
    return Design(name, (Pool("prompt", prompt), Pool("token", token, cap_frac=token_cap)))


#: The paper's six designs (Splitwise §V-C, Table V).
DESIGNS: dict[str, Design] = {
    "baseline-a100": _colocated("baseline-a100", "dgx-a100"),
    "baseline-h100": _colocated("baseline-h100", "dgx-h100"),
    "splitwise-aa": _split("splitwise-aa", "dgx-a100", "dgx-a100"),
    "splitwise-hh": _split("splitwise-hh", "dgx-h100", "dgx-h100"),
    "splitwise-ha": _split("splitwise-ha", "dgx-h100", "dgx-a100"),
    "splitwise-hhcap": _split("splitwise-hhcap", "dgx-h100", "dgx-h100", 0.7),
}
#: Every named design: the paper's six and the chunked-prefill colocated designs.
PRESETS: dict[str, Design] = {
    **DESIGNS,
    "chunked-a100": _colocated("chunked-a100", "dgx-a100", DEFAULT_TOKEN_BUDGET),
    "chunked-h100": _colocated("chunked-h100", "dgx-h100", DEFAULT_TOKEN_BUDGET),
}


def get_design(name: str) -> Design:
    """A preset by name (`PRESETS`), or ValueError listing them."""
    return PRESETS[check_choice("design", name, sorted(PRESETS))]


@lru_cache(maxsize=32)
def _table(model: str, hardware: str, profiles_path: str | None):
    from splitwise_jax.phases.sim_table import SimTable

    return SimTable.from_profiles(profiles_path, model, hardware, 8)


def instance_machine(machine: Machine | str, tp: int | None = None) -> Machine:
    """The unit a pool counts: the machine, or with tp < its GPUs one tp-GPU instance
    (a slice of it with its share of cost, provisioned and host power; name "<machine>/tp<N>").

    Raises:
        ValueError: tp outside [1, GPUs per machine], or not dividing the GPUs.
    """
    m = machine if isinstance(machine, Machine) else catalog.get_machine(machine)
    tp = memory.resolve_tp(m, tp)
    if tp == m.gpus_per_machine:
        return m
    if m.gpus_per_machine % tp:
        raise ValueError(f"tp must divide the {m.gpus_per_machine} GPUs of {m.name} (instances of tp GPUs each), "
                         f"got tp={tp}")
    share = tp / m.gpus_per_machine
    return m.replace(name=f"{m.name}/tp{tp}", gpus_per_machine=tp, cost_per_hour=m.cost_per_hour * share,
                     provisioned_power_w=m.provisioned_power_w * share, host_power_w=m.host_power_w * share)


def _llm(model: str | LLM) -> LLM:
    return model if isinstance(model, LLM) else catalog.get_llm(model)


def make_timing(machine_name: str | Machine, model: str | LLM = "bloom-176b", cap_frac: float = 1.0,
                phase_model: str = "calibrated", profiles_path: str | None = None, params_path=None):
    """Timing strategy for one machine type (a catalogue name, or a `Machine`).

    The phase parameters come from `provenance.params_for`: the GPU's own fit if it
    has profiles, else the nearest calibrated GPU's (see `pool_provenance`).
    """
    check_choice("phase_model", phase_model, PHASE_MODELS)
    machine = machine_name if isinstance(machine_name, Machine) else catalog.get_machine(machine_name)
    llm = _llm(model)
    check_range("cap_frac", cap_frac, float(cap_floor_frac(machine.gpu)), 1.0)
    params, _ = params_for(machine.gpu, llm, params_path)
    cal = CalibratedTiming(params, machine, llm, cap_frac)
    if phase_model == "calibrated":
        return cal
    if machine.name not in _HARDWARE_OF_MACHINE:
        raise ValueError(f"phase_model 'splitwise-sim-table' has profiles only for machines "
                         f"{sorted(_HARDWARE_OF_MACHINE)} at tp=8, got {machine.name!r}")
    hw = _HARDWARE_OF_MACHINE[machine.name]
    if hw == "h100-80gb" and abs(cap_frac - 0.7) < 1e-9:
        hw = "h100-80gb-pcap"
    elif cap_frac != 1.0:
        raise ValueError("phase_model 'splitwise-sim-table' knows caps 1.0 (A100, H100) and 0.7 (H100) only, "
                         f"got cap_frac={cap_frac}")
    return SimTableTiming(_table(llm.name, hw, profiles_path), cal)


def build_cluster(design: Design, *, model: str | LLM = "bloom-176b", phase_model: str = "calibrated",
                  sim_compat: bool | None = None, profiles_path: str | None = None, params_path=None) -> Cluster:
    """Build the `Cluster` pytree of a design whose pools all have counts.

    Args:
        design: the pools, link and scheduler.
        model: LLM name (catalogue or spec file) or an `LLM`.
        phase_model: "calibrated" or "splitwise-sim-table".
        sim_compat: use SplitwiseSim's KV transfer (200 GiB/s, no set-up, no GQA);
            defaults to True with the sim table, False with the calibrated model.
        profiles_path, params_path: the profile file (sim table) and params file.

    Raises:
        ValueError: a pool without a count or with several machine types, an unknown
            machine, a cap below the GPU's floor, a tp the machine cannot take, or a
            model whose weights do not fit a pool's instance (`memory.check_fits`).

    Example:
        >>> d = Design("mine", (Pool("prompt", "dgx-h200", 20), Pool("token", "dgx-b200", 4, cap_frac=0.8)))
        >>> build_cluster(d, model="llama3.1-70b").kind
        'splitwise'
    """
    llm = _llm(model)
    for p in design.pools:
        if p.count is None:
            raise ValueError(f"design {design.name!r}: the {p.role} pool has no count (give count = N)")
        if len(p.machines) > 1:
            raise ValueError(f"design {design.name!r}: the {p.role} pool lists machines {list(p.machines)}; "
                             "a cluster has one machine type per pool (the list is for optimize)")
    sim_compat = (phase_model == "splitwise-sim-table") if sim_compat is None else sim_compat
    first, tok = design.first_pool, design.pool("token")
    kw = dict(model=llm, phase_model=phase_model, profiles_path=profiles_path, params_path=params_path)
    machines = {}
    for p in design.pools:
        m = instance_machine(p.machine, p.tp)
        if phase_model != "calibrated" and m.name != p.machine:
            raise ValueError(f"phase_model {phase_model!r} has profiles at tp=8 only; the {p.role} pool asks "
                             f"tp={p.tp}")
        memory.check_fits(llm, m)
        machines[p.role] = m
    prompt = make_timing(machines[first.role], cap_frac=first.cap_frac, **kw)
    # A colocated design's token slot is unused: the same machine, as the paper's baselines.
    token = make_timing(machines["token"], cap_frac=tok.cap_frac, **kw) if tok is not None else \
        make_timing(machines[first.role], cap_frac=1.0, **kw)
    alone = make_timing(_SLOWDOWN_REFERENCE, **kw)
    if sim_compat:
        bw, setup = SIM_LINK_BYTES_PER_S, 0.0
    else:
        src, dst = prompt.machine, token.machine
        bw = kv_transfer.kv_transfer_bandwidth(params_for(src.gpu, llm, params_path)[0], src, dst)
        setup = src.kv_setup_s
    if design.kv_bandwidth_bytes_per_s is not None:
        bw = design.kv_bandwidth_bytes_per_s
    transfer = Transfer(bandwidth_bytes_per_s=float(bw), setup_s=float(setup), mode=design.transfer_mode,
                        ignore_gqa=bool(sim_compat))
    strategy = design.strategy
    return Cluster(prompt=prompt, token=token, alone=alone, n_prompt=float(first.count),
                   n_token=float(tok.count) if tok is not None else 0.0, transfer=transfer,
                   scheduling=strategy.scheduling(design.scheduling, design), strategy=strategy, name=design.name)


def make_cluster(design: str | Design, n_prompt: float, n_token: float = 0.0, *, model: str | LLM = "bloom-176b",
                 phase_model: str = "calibrated", transfer_mode: str | None = None,
                 sim_compat: bool | None = None, prompt_cap_frac: float | None = None,
                 token_cap_frac: float | None = None, kv_bandwidth_bytes_per_s: float | None = None,
                 scheduling: Scheduling | None = None, profiles_path: str | None = None,
                 params_path=None, chunked_prefill_tokens: float | None = None) -> Cluster:
    """Build a `Cluster` for a named design (`PRESETS`) or a `Design`, with pool sizes.

    Args:
        design: a preset name (the paper's six, chunked-a100, chunked-h100) or a `Design`.
        n_prompt: prompt machines (a colocated design's machines), > 0.
        n_token: token machines (Splitwise designs), > 0.
        model: LLM name or `LLM`.
        phase_model: "calibrated" or "splitwise-sim-table".
        transfer_mode: "serialized" or "layerwise" (None: the design's; presets serialized).
        sim_compat: use SplitwiseSim's KV transfer (200 GiB/s, no set-up, no GQA);
            defaults to True with the sim table, False with the calibrated model.
        prompt_cap_frac, token_cap_frac: power caps as fractions of TDP (None: the
            design's: 0.7 for HHcap's token pool, else 1).
        kv_bandwidth_bytes_per_s: override of the transfer bandwidth.
        scheduling: scheduler knobs (None: the design's; presets SplitwiseSim's).
        chunked_prefill_tokens: token budget of a chunked-prefill design (None: the
            design's; presets 512).

    Example:
        >>> make_cluster("splitwise-hh", 27, 3).n_prompt
        27.0
    """
    d = get_design(design) if isinstance(design, str) else design
    splitwise = d.strategy.token_pool
    check_positive("n_prompt" if splitwise else "machines", n_prompt)
    if splitwise:
        check_positive("n_token", n_token)
    d = d.with_counts(float(n_prompt), float(n_token) if splitwise else None)
    pools = []
    for p in d.pools:
        cap = token_cap_frac if p.role == "token" else prompt_cap_frac
        pools.append(p.replace(cap_frac=p.cap_frac if cap is None else _cap(cap)))
    if chunked_prefill_tokens is not None and d.chunked_prefill_tokens is None:  # not a chunked design
        raise ValueError(f"chunked_prefill_tokens applies to a chunked-prefill design (chunked-a100, chunked-h100 or "
                         f"a colocated design with a token budget), not {d.name!r}")
    d = d.replace(pools=tuple(pools),
                  transfer_mode=d.transfer_mode if transfer_mode is None else transfer_mode,
                  kv_bandwidth_bytes_per_s=(d.kv_bandwidth_bytes_per_s if kv_bandwidth_bytes_per_s is None
                                            else kv_bandwidth_bytes_per_s),
                  scheduling=d.scheduling if scheduling is None else scheduling,
                  chunked_prefill_tokens=(d.chunked_prefill_tokens if chunked_prefill_tokens is None
                                          else chunked_prefill_tokens))
    return build_cluster(d, model=model, phase_model=phase_model, sim_compat=sim_compat,
                         profiles_path=profiles_path, params_path=params_path)


def _cap(cap) -> float:
    check_range("cap_frac", cap, 0.0, 1.0)
    return float(cap)


def cluster_pools(cluster: Cluster) -> tuple[tuple[str, object, float], ...]:
    """(role, timing, count) of each pool of a built cluster (`strategy.pools`)."""
    return cluster.strategy.pools(cluster)


def pool_provenance(cluster: Cluster, params_path=None) -> tuple[tuple[str, Provenance], ...]:
    """Where each pool's phase parameters come from, and their expected error.

    Returns:
        (role, `provenance.Provenance`) per pool: "calibrated" for a GPU with profiles
        of its own, "transferred-from:<gpu>" for one running on the nearest calibrated
        GPU's fit (expected error: the calibration's split (c)).
    """
    return tuple((role, provenance(t.machine.gpu, t.llm, params_path)) for role, t, _ in cluster_pools(cluster))


def uniform_names(tree, label: str = "_"):
    """The same pytree with every static ``name`` field set to `label`, recursively.

    Names are static pytree metadata used only in messages (checked on concrete inputs
    before tracing), but each distinct name is a distinct treedef and hence a fresh
    compile; with uniform names every design of one strategy (HH, AA, HA, HHcap) runs
    through one compiled program.
    """
    if not dataclasses.is_dataclass(tree) or isinstance(tree, type):
        return tree
    changes = {}
    for f in dataclasses.fields(tree):
        value = getattr(tree, f.name)
        if f.name == "name" and f.metadata.get("static"):
            changes[f.name] = label
        elif dataclasses.is_dataclass(value):
            changes[f.name] = uniform_names(value, label)
    return dataclasses.replace(tree, **changes)
