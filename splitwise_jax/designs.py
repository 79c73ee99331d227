"""The paper's cluster designs, built into `Cluster` pytrees.

| design          | prompt pool     | token pool          |
|-----------------|-----------------|---------------------|
| baseline-a100   | DGX-A100 (mixed)| -                   |
| baseline-h100   | DGX-H100 (mixed)| -                   |
| splitwise-aa    | DGX-A100        | DGX-A100            |
| splitwise-hh    | DGX-H100        | DGX-H100            |
| splitwise-ha    | DGX-H100        | DGX-A100            |
| splitwise-hhcap | DGX-H100        | DGX-H100 at 70% cap |

Phase timing is either the calibrated smooth model ("calibrated") or SplitwiseSim's
profile table ("splitwise-sim-table", read from the shared profile file). The
`sim_compat` transfer reproduces the reference simulator's KV transfer (one flow over a
200 GiB/s link, no set-up cost, cache sized without grouped-query attention).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from splitwise_jax import catalog, kv_transfer
from splitwise_jax._validate import check_choice, check_positive, check_range
from splitwise_jax.cluster import Cluster, Scheduling, Transfer
from splitwise_jax.params import load_params
from splitwise_jax.timing import CalibratedTiming, SimTableTiming


@dataclass(frozen=True)
class DesignSpec:
    kind: str
    prompt_machine: str
    token_machine: str | None
    token_cap_frac: float = 1.0


DESIGNS: dict[str, DesignSpec] = {
    "baseline-a100": DesignSpec("baseline", "dgx-a100", None),
    "baseline-h100": DesignSpec("baseline", "dgx-h100", None),
    "splitwise-aa": DesignSpec("splitwise", "dgx-a100", "dgx-a100"),
    "splitwise-hh": DesignSpec("splitwise", "dgx-h100", "dgx-h100"),
    "splitwise-ha": DesignSpec("splitwise", "dgx-h100", "dgx-a100"),
    "splitwise-hhcap": DesignSpec("splitwise", "dgx-h100", "dgx-h100", 0.7),
}
PHASE_MODELS = ("calibrated", "splitwise-sim-table")
TRANSFER_MODES = ("serialized", "layerwise")
SIM_LINK_BYTES_PER_S = 200 * 2.0**30  # SplitwiseSim's KV link (shared/validation/README.md)
_HARDWARE_OF_MACHINE = {"dgx-a100": "a100-80gb", "dgx-h100": "h100-80gb"}


@lru_cache(maxsize=32)
def _table(model: str, hardware: str, profiles_path: str | None):
    from splitwise_jax.sim_table import SimTable

    return SimTable.from_profiles(profiles_path, model, hardware, 8)


def make_timing(machine_name: str, model: str = "bloom-176b", cap_frac: float = 1.0,
                phase_model: str = "calibrated", profiles_path: str | None = None, params_path=None):
    """Timing strategy for one machine type."""
    check_choice("phase_model", phase_model, PHASE_MODELS)
    machine = catalog.get_machine(machine_name)
    llm = catalog.get_llm(model)
    check_range("cap_frac", cap_frac, float(machine.gpu.min_cap_w / machine.gpu.tdp_w), 1.0)
    cal = CalibratedTiming(load_params(machine.gpu.name, params_path), machine, llm, cap_frac)
    if phase_model == "calibrated":
        return cal
    if machine_name not in _HARDWARE_OF_MACHINE:
        raise ValueError(f"phase_model 'splitwise-sim-table' has profiles only for machines "
                         f"{sorted(_HARDWARE_OF_MACHINE)}, got {machine_name!r}")
    hw = _HARDWARE_OF_MACHINE[machine_name]
    if hw == "h100-80gb" and abs(cap_frac - 0.7) < 1e-9:
        hw = "h100-80gb-pcap"
    elif cap_frac != 1.0:
        raise ValueError("phase_model 'splitwise-sim-table' knows caps 1.0 (A100, H100) and 0.7 (H100) only, "
                         f"got cap_frac={cap_frac}")
    return SimTableTiming(_table(model, hw, profiles_path), cal)


def make_cluster(design: str, n_prompt: float, n_token: float = 0.0, *, model: str = "bloom-176b",
                 phase_model: str = "calibrated", transfer_mode: str = "serialized",
                 sim_compat: bool | None = None, prompt_cap_frac: float = 1.0,
                 token_cap_frac: float | None = None, kv_bandwidth_bytes_per_s: float | None = None,
                 scheduling: Scheduling = Scheduling(), profiles_path: str | None = None,
                 params_path=None) -> Cluster:
    """Build a `Cluster` for one of the paper's designs.

    Args:
        design: one of DESIGNS.
        n_prompt: prompt machines (a baseline's machines), > 0.
        n_token: token machines (Splitwise designs), > 0.
        model: LLM name.
        phase_model: "calibrated" or "splitwise-sim-table".
        transfer_mode: "serialized" or "layerwise".
        sim_compat: use SplitwiseSim's KV transfer (200 GiB/s, no set-up, no GQA);
            defaults to True with the sim table, False with the calibrated model.
        prompt_cap_frac, token_cap_frac: power caps as fractions of TDP (token cap
            defaults to the design's: 0.7 for HHcap, else 1).
        kv_bandwidth_bytes_per_s: override of the transfer bandwidth.
    """
    spec = DESIGNS[check_choice("design", design, sorted(DESIGNS))]
    check_choice("transfer_mode", transfer_mode, TRANSFER_MODES)
    check_positive("n_prompt" if spec.kind == "splitwise" else "machines", n_prompt)
    if spec.kind == "splitwise":
        check_positive("n_token", n_token)
    sim_compat = (phase_model == "splitwise-sim-table") if sim_compat is None else sim_compat
    t_cap = spec.token_cap_frac if token_cap_frac is None else token_cap_frac
    kw = dict(model=model, phase_model=phase_model, profiles_path=profiles_path, params_path=params_path)
    prompt = make_timing(spec.prompt_machine, cap_frac=prompt_cap_frac, **kw)
    token = make_timing(spec.token_machine or spec.prompt_machine, cap_frac=t_cap, **kw)
    alone = make_timing("dgx-a100", **kw)
    if sim_compat:
        bw, setup = SIM_LINK_BYTES_PER_S, 0.0
    else:
        src, dst = prompt.machine, token.machine
        bw = kv_transfer.kv_transfer_bandwidth(load_params(src.gpu.name, params_path), src, dst)
        setup = src.kv_setup_s
    if kv_bandwidth_bytes_per_s is not None:
        check_positive("kv_bandwidth_bytes_per_s", kv_bandwidth_bytes_per_s)
        bw = kv_bandwidth_bytes_per_s
    transfer = Transfer(bandwidth_bytes_per_s=float(bw), setup_s=float(setup), mode=transfer_mode,
                        ignore_gqa=bool(sim_compat))
    return Cluster(prompt=prompt, token=token, alone=alone, n_prompt=float(n_prompt),
                   n_token=float(n_token) if spec.kind == "splitwise" else 0.0, transfer=transfer,
                   scheduling=scheduling, kind=spec.kind, name=design)


def uniform_names(tree, label: str = "_"):
    """The same pytree with every static ``name`` field set to `label`, recursively.

    Names are static pytree metadata used only in messages (checked on concrete inputs
    before tracing), but each distinct name is a distinct treedef and hence a fresh
    compile; with uniform names every design of one kind (HH, AA, HA, HHcap) runs
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
