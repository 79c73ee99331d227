"""What a colocated decode sits through near saturation: the simulator against the model.

(GitHub issue 39.) Near saturation the fluid model's TBT on the baselines is low against
our request-level simulator (docs/validation.md). A decode on a colocated machine makes
one token per decode-only iteration and sits through the machine's prompt iterations,
making a token in those it rides (the prompt leaves room under `max_batch_tokens`). Its
mean time per token is then the fixed point

    TBT = t_d + r TBT L   ->   TBT = t_d / (1 - r L),

with t_d the decode-only iteration, r the machine's prompt iterations per second and L
what one costs a decoder (its length less the token a rider makes, t_d x the riding
share). Near saturation r L is 0.75-0.9, so a few per cent in r or L move TBT by tens of
per cent. This study measures each factor in the simulation (the executed blocks and the
requests' decode intervals on their machines, over the arrival window) and reads the
model's from the decode route's pool state (`events_per_step / step_s`, `interf_mean_s`,
`decode_s`), on the random configurations of `validate_simulator.py --mode fluid-vs-sim`
(seed 0) whose design is a baseline, with Poisson arrivals, between two loads.

Writes ``colocated_tbt.csv`` (one row per configuration: each factor measured and
modelled, the simulated TBT mean and P50, the model's TBT P50) and ``colocated_tbt.md``
(the table) into ``--out``. Needs no ../shared data; ~10-60 s per configuration on the
2-core machine (one simulation and one model evaluation each). Not run by the suite.

Usage:
    python studies/colocated_tbt.py [--min-load 0.8] [--max-load 0.95] [--configs 19 45] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import splitwise_jax as sj  # noqa: E402
from splitwise_jax.cluster.cluster import Resolution, _classes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_simulator import _config_inputs, _fluid, _markdown, random_configs  # noqa: E402


def simulated_factors(res, trace) -> dict:
    """r, the mean prompt iteration a decoder sits through (T), the riding share, t_d and
    L = T - t_d x riding share, measured on one simulated run over its arrival window."""
    rq = res.requests.dropna(subset=["tbt_s"])
    b = res.raw.blocks      # machine, start, end, iterations, P, n, S, B, C
    a0, a1 = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
    index = {m.name: i for i, m in enumerate(res.raw.machines)}
    seen_s = seen = riders = 0.0
    prompt_its = 0
    d_time = d_steps = 0.0
    for name, g in rq.groupby("token_machine"):
        mb = b[b[:, 0] == index[name]]
        mb = mb[(mb[:, 1] >= a0) & (mb[:, 2] <= a1)]
        start, end = np.sort(g.prompt_end_s.to_numpy()), np.sort(g.token_end_s.to_numpy())
        # decoders on the machine when a block starts: decode intervals open at that time
        present = np.searchsorted(start, mb[:, 1], side="right") - np.searchsorted(end, mb[:, 1], side="right")
        has_prompt = mb[:, 5] > 0
        it_s = (mb[:, 2] - mb[:, 1]) / mb[:, 3]
        seen_s += np.sum(present[has_prompt] * it_s[has_prompt])
        seen += present[has_prompt].sum()
        riders += mb[has_prompt, 7].sum()
        prompt_its += int(has_prompt.sum())
        dec = ~has_prompt & (mb[:, 7] > 0)
        d_time += np.sum(mb[dec, 7] * mb[dec, 3] * it_s[dec])
        d_steps += np.sum(mb[dec, 7] * mb[dec, 3])
    r = prompt_its / len(res.raw.machines) / (a1 - a0)
    T = seen_s / seen
    ride = riders / seen
    t_d = d_time / d_steps
    L = T - t_d * ride
    return {"r_sim": r, "T_sim": T, "ride_sim": ride, "td_sim": t_d, "L_sim": L, "rL_sim": r * L,
            "fixed_point_sim": t_d / (1.0 - r * L), "tbt_mean_sim": rq.tbt_s.mean(), "tbt_p50_sim": rq.tbt_s.median()}


def modelled_factors(cluster, wl, rate, horizon_s: float) -> dict:
    """The same factors in the model: the decode route's pool state."""
    cls = _classes(wl)
    flows = cluster.strategy.flows(cluster, cls, jnp.asarray(rate), jnp.asarray(wl.arrival_cv2, float), horizon_s,
                                   Resolution(), horizon_s)
    st = flows.decode_routes[0].state
    r = float(st.events_per_step) / float(st.step_s)
    L = float(st.interf_mean_s)
    return {"r_mod": r, "td_mod": float(st.decode_s), "L_mod": L, "rL_mod": r * L, "step_mod": float(st.step_s),
            "tbt_p50_mod": _fluid(cluster, wl, horizon_s)["tbt_s"]["p50"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-load", type=float, default=0.8)
    ap.add_argument("--max-load", type=float, default=0.95)
    ap.add_argument("--configs", type=int, nargs="*", help="configuration numbers (default: every baseline in the band)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "colocated_tbt")
    a = ap.parse_args(argv)
    cfgs = random_configs(200, 0)
    if a.configs:
        sel = cfgs[cfgs.config.isin(a.configs)]
    else:
        sel = cfgs[cfgs.design.str.startswith("baseline") & (cfgs.arrivals == "poisson")
                   & (cfgs.load >= a.min_load) & (cfgs.load < a.max_load)]
    if sel.empty:
        print("no configuration matches", file=sys.stderr)
        return 2
    rows = []
    for _, cfg in sel.iterrows():
        # the trace validate_simulator.py simulates for this configuration (seed 0 + its number)
        cluster, trace, wl, rate = _config_inputs(cfg, 120.0, int(cfg.config), 0)
        res = sj.simulate(cluster, trace, power=False)
        rows.append({"config": int(cfg.config), "design": cfg.design, "machines": int(cfg.n_prompt),
                     "workload": cfg.workload, "model": cfg.model, "load": float(cfg.load),
                     **simulated_factors(res, trace), **modelled_factors(cluster, wl, rate, 120.0)})
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    df = pd.DataFrame(rows)
    df["err_tbt_p50"] = df.tbt_p50_mod / df.tbt_p50_sim - 1.0
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "colocated_tbt.csv", index=False)
    cols = ["config", "design", "machines", "workload", "model", "load", "r_sim", "r_mod", "L_sim", "L_mod",
            "td_sim", "td_mod", "rL_sim", "rL_mod", "fixed_point_sim", "tbt_mean_sim", "tbt_p50_sim",
            "tbt_p50_mod", "err_tbt_p50"]
    (a.out / "colocated_tbt.md").write_text(_markdown(df[cols], 3) + "\n")
    print(df[cols].round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
