"""Interconnect-bandwidth sensitivity, and the sensitivity of the optimum to the GPU.

The paper leaves open whether a slower interconnect (RoCE, Ethernet: ~10x slower than
its 400 Gbps-per-GPU InfiniBand) would still make Splitwise pay off. We sweep the KV
transfer bandwidth from 10x more to 100x less than InfiniBand (4,000 to 4 Gbps per GPU,
x 8 GPUs x the link efficiency 0.9), for every Splitwise design, serialized and
layer-wise, on the coding trace (BLOOM-176B), and measure:

1. throughput at SLO of the design's iso-power cluster (fixed pools, sized at
   InfiniBand speed): bisection on the rate;
2. cost at a target load (70 req/s): for each prompt share of the machines, the
   smallest (continuous) cluster meeting every SLO, by bisection on its size; the
   cheapest share wins;
3. the nine latency percentiles of the iso-power cluster at 80% of its InfiniBand
   throughput at SLO.

Elasticities (d log metric / d log bandwidth) come from the sweeps (central differences)
and from automatic differentiation (`_common.margin_jacobian`, forward mode through
`evaluate`): latency elasticities directly; throughput at SLO and cost at target through
the implicit function theorem on the binding SLO margin (see
`_common.implicit_sensitivities`; for the cost this is the envelope theorem).

The paper's question is answered by comparing with the baselines, which do not transfer
KV caches and so do not depend on the link: the bandwidth below which a Splitwise
design's cost at 70 req/s exceeds the cheaper baseline's, and below which its iso-power
throughput at SLO falls under Baseline-H100's.

Finally the sensitivity of the cost-optimal design to the GPU: elasticities of the cost
at 70 req/s with respect to HBM bandwidth, FLOP/s and the power cap of the prompt and
token machines (same Jacobian, envelope theorem).

Outputs (studies/out/bandwidth_sensitivity/): ``bandwidth_sweep.csv`` (design x mode x
bandwidth: throughput at SLO, cost at target, latencies), ``bandwidth_elasticities.csv``
(sweep vs autodiff), ``bandwidth_breakeven.csv``, ``optimum_sensitivity.csv``,
``bandwidth_paper_vs_ours.csv``, ``bandwidth_sensitivity.png``.

Usage:
    python studies/bandwidth_sensitivity.py [--out DIR]
    SPLITWISE_SMOKE=1 python studies/bandwidth_sensitivity.py   # 4 bandwidths, HH only, serialized only
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import _common as C

from splitwise_jax.optimize import search_boundary

STUDY = "bandwidth_sensitivity"
TARGET_RATE = 70.0  # req/s: cost at target load (the paper's Fig. 12 load)
LOAD_FRAC = 0.8  # latency percentiles at this fraction of the IB throughput at SLO
MODES = ("serialized", "layerwise")


def modes() -> tuple[str, ...]:
    """Transfer modes studied: both, or serialized alone in smoke runs (the layer-wise
    cluster is a second set of compiled programs; the code path is the same)."""
    return MODES[:1] if C.SMOKE else MODES
N_BOUNDS = (2.0, 400.0)  # total machines searched for the cost at target


def bandwidths_gbps() -> np.ndarray:
    return np.array([4000.0, 400.0, 40.0, 4.0]) if C.SMOKE else np.geomspace(4000.0, 4.0, 13)


def prompt_shares() -> np.ndarray:
    return np.array([0.5, 0.7, 0.85]) if C.SMOKE else np.linspace(0.3, 0.95, 14)


def min_machines(c, wl, design, share, bw):
    """Smallest total machines N (continuous) meeting every SLO with share*N prompt machines."""
    share, bw = np.broadcast_arrays(np.asarray(share, float), np.asarray(bw, float))
    share, bw = share.ravel(), bw.ravel()
    base = C.is_baseline(design)

    def ok(rows, log_n):
        k = log_n.shape[1]
        n = np.exp(log_n).ravel()
        s = np.repeat(share[rows], k)
        n_p, n_t = (n, 0.0 * n) if base else (n * s, n * (1.0 - s))
        df = C.sweep(c, wl, n_prompt=n_p, n_token=n_t, kv_bandwidth=np.repeat(bw[rows], k))
        return df["meets_slo"].to_numpy().reshape(log_n.shape)

    return search_boundary(ok, np.full(share.size, np.log(N_BOUNDS[0])), np.full(share.size, np.log(N_BOUNDS[1])),
                           increasing=True, rel_tol=C.search_tol(), points=C.search_points(share.size)).value


def cost_at_target(design, mode, wl, bws):
    """(cost $/h, prompt share, total machines) of the cheapest share at each bandwidth."""
    c = C.cluster(design, transfer_mode=mode)
    up, ut = C.machine_cost(design)
    shares = np.array([1.0]) if C.is_baseline(design) else prompt_shares()
    S, B = np.meshgrid(shares, bws, indexing="ij")
    n = min_machines(c, wl, design, S.ravel(), B.ravel()).reshape(S.shape)
    cost = n * (S * up + (1.0 - S) * ut)
    i = np.argmin(cost, axis=0)
    j = np.arange(len(bws))
    return cost[i, j], S[i, j], n[i, j]


def main(argv=None) -> int:
    args = C.parse_args(STUDY, __doc__, argv)
    t0 = C.banner(STUDY)
    gbps = bandwidths_gbps()
    bws = C.kv_bandwidth_of_gbps(gbps)
    ib = float(C.kv_bandwidth_of_gbps(C.IB_GBPS_PER_GPU))
    wl = C.study_workload("coding", TARGET_RATE)
    designs = ("splitwise-hh",) if C.SMOKE else C.SPLITWISE

    # Baselines: no KV transfer, one number each.
    base = {}
    for d in C.BASELINES:
        n_p, n_t = C.iso_power_pools(d, "coding")
        thr = float(C.throughput_at_slo(C.cluster(d), wl, n_p, n_t))
        cost, _, n = cost_at_target(d, "serialized", wl, np.array([ib]))
        base[d] = dict(throughput_at_slo=thr, cost_at_target=float(cost[0]), machines_at_target=float(n[0]))
        print(f"{d:<16} iso-power throughput at SLO {thr:7.2f} req/s; cost at {TARGET_RATE:g} req/s "
              f"${float(cost[0]):7.0f}/h ({float(n[0]):.1f} machines)", flush=True)

    rows, jac_points = [], []
    for d in designs:
        n_p, n_t = C.iso_power_pools(d, "coding")
        for mode in modes():
            c = C.cluster(d, transfer_mode=mode)
            thr = C.throughput_at_slo(c, wl, n_p, n_t, kv_bandwidth=bws)
            thr_ib = float(C.throughput_at_slo(c, wl, n_p, n_t, kv_bandwidth=ib))
            load = LOAD_FRAC * thr_ib
            lat = C.sweep(c, wl, n_prompt=n_p, n_token=n_t, rate=load, kv_bandwidth=bws)
            cost, share, n = cost_at_target(d, mode, wl, bws)
            df = pd.DataFrame({"design": d, "mode": mode, "gbps_per_gpu": gbps, "kv_bandwidth_bytes_per_s": bws,
                               "n_prompt": n_p, "n_token": n_t, "throughput_at_slo": thr, "latency_load_rps": load,
                               "cost_at_target": cost, "cost_opt_prompt_share": share, "cost_opt_machines": n})
            for col in C.LATENCY_COLS + ("meets_slo",):
                df[col] = lat[col].to_numpy()
            rows.append(df)
            print(f"{d:<16} {mode:<10} throughput at SLO {np.round(thr, 1)}  cost ${np.round(cost, 0)}", flush=True)
            # Autodiff points at InfiniBand speed (every bandwidth in full runs): the
            # latency operating point, the throughput boundary, the cost boundary.
            at = range(len(gbps)) if not C.SMOKE else [int(np.argmin(np.abs(gbps - C.IB_GBPS_PER_GPU)))]
            for k in at:
                jac_points.append(dict(design=d, mode=mode, gbps_per_gpu=gbps[k], kind="latency", n_prompt=n_p,
                                       n_token=n_t, rate=load, bw=bws[k]))
                if thr[k] > 0:
                    jac_points.append(dict(design=d, mode=mode, gbps_per_gpu=gbps[k], kind="throughput",
                                           n_prompt=n_p, n_token=n_t, rate=thr[k], bw=bws[k]))
                if np.isfinite(cost[k]):
                    jac_points.append(dict(design=d, mode=mode, gbps_per_gpu=gbps[k], kind="cost",
                                           n_prompt=n[k] * share[k], n_token=n[k] * (1 - share[k]), rate=TARGET_RATE,
                                           bw=bws[k]))
    sweep = pd.concat(rows, ignore_index=True)
    elast = autodiff(jac_points, wl)
    fd = finite_differences(sweep)
    elasticities = fd.merge(elast.drop(columns=["n_prompt", "n_token", "rate", "bw"], errors="ignore"),
                            on=["design", "mode", "gbps_per_gpu"], how="left")
    breakeven = break_even(designs, wl, base)
    optimum = optimum_sensitivity(jac_points, elast, wl)
    C.print_frame(breakeven, "Where Splitwise stops paying off (bandwidth per GPU, Gbps; InfiniBand = 400)")
    ib_rows = elasticities[np.isclose(elasticities["gbps_per_gpu"], C.IB_GBPS_PER_GPU)]
    cols = [c for c in ("design", "mode", "fd_throughput_at_slo", "ad_throughput_at_slo", "fd_cost_at_target",
                        "ad_cost_at_target", "fd_e2e_p50_s", "ad_e2e_p50_s", "fd_e2e_p99_s", "ad_e2e_p99_s")
            if c in ib_rows.columns]
    C.print_frame(ib_rows[cols],
                  "Elasticities d log(metric) / d log(bandwidth) at 400 Gbps: sweep (fd) vs autodiff (ad)")
    C.print_frame(optimum, "Elasticity of the cost at 70 req/s w.r.t. GPU specs (envelope theorem), at 400 Gbps")

    table = C.paper_vs_ours(claims(breakeven), "Bandwidth: the paper's open question (paper vs ours)")
    paths = [C.write_csv(sweep, args.out / "bandwidth_sweep.csv"),
             C.write_csv(elasticities, args.out / "bandwidth_elasticities.csv"),
             C.write_csv(breakeven, args.out / "bandwidth_breakeven.csv"),
             C.write_csv(optimum, args.out / "optimum_sensitivity.csv"),
             C.write_csv(table, args.out / "bandwidth_paper_vs_ours.csv"),
             plot(sweep, base, args)]
    C.done(STUDY, t0, paths)
    return 0


def autodiff(points, wl) -> pd.DataFrame:
    """Elasticities w.r.t. bandwidth from one Jacobian per point (grouped by design kind/mode)."""
    if not points:
        return pd.DataFrame(columns=["design", "mode", "gbps_per_gpu"])
    pts = pd.DataFrame(points)
    out = {}
    for (d, mode), g in pts.groupby(["design", "mode"], sort=False):
        c = C.cluster(d, transfer_mode=mode)
        vals, jac = C.margin_jacobian(c, wl, g["n_prompt"], g["n_token"], g["rate"], g["bw"])
        sens = C.implicit_sensitivities(jac)
        k_bw = C.THETA.index("kv_bw")
        for i, (_, p) in enumerate(g.iterrows()):
            key = (d, mode, p["gbps_per_gpu"])
            row = out.setdefault(key, dict(design=d, mode=mode, gbps_per_gpu=p["gbps_per_gpu"]))
            if p["kind"] == "latency":
                for j, name in enumerate(C.OUTPUTS):
                    if name.startswith("log_") and name.endswith("_s"):
                        row[f"ad_{name[4:]}"] = jac[i, j, k_bw]
            elif p["kind"] == "throughput":
                row["ad_throughput_at_slo"] = sens["throughput_at_slo"][i, k_bw]
                row["margin_at_throughput_boundary"] = vals[i, 0]
            else:
                row["ad_cost_at_target"] = sens["cost_at_target"][i, k_bw]
                row["margin_at_cost_boundary"] = vals[i, 0]
                for t, name in enumerate(C.THETA):
                    row[f"cost_elasticity_{name}"] = sens["cost_at_target"][i, t]
    return pd.DataFrame(list(out.values()))


def finite_differences(sweep: pd.DataFrame) -> pd.DataFrame:
    """Central differences of log(metric) in log(bandwidth) along each sweep."""
    frames = []
    for (d, mode), g in sweep.groupby(["design", "mode"], sort=False):
        g = g.sort_values("gbps_per_gpu")
        x = np.log(g["gbps_per_gpu"].to_numpy())
        out = pd.DataFrame({"design": d, "mode": mode, "gbps_per_gpu": g["gbps_per_gpu"].to_numpy()})
        for col in ("throughput_at_slo", "cost_at_target") + C.LATENCY_COLS:
            y = g[col].to_numpy(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                ly = np.where((y > 0) & np.isfinite(y), np.log(np.where(y > 0, y, 1.0)), np.nan)
                out[f"fd_{col}"] = np.gradient(ly, x) if len(x) > 1 else np.nan
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


BW_SEARCH_GBPS = (0.1, 40000.0)


def min_bandwidth_gbps(c, wl, n_prompt, n_token, rate) -> np.ndarray:
    """Smallest KV link (Gbps per GPU) at which each configuration meets every SLO at
    `rate` (latency never falls as bandwidth falls, tests/test_cluster.py); inf where
    even the fastest link searched fails."""
    n_p, n_t = np.broadcast_arrays(np.asarray(n_prompt, float), np.asarray(n_token, float))
    n_p, n_t = n_p.ravel(), n_t.ravel()

    def ok(rows, log_g):
        k = log_g.shape[1]
        df = C.sweep(c, wl, n_prompt=np.repeat(n_p[rows], k), n_token=np.repeat(n_t[rows], k), rate=rate,
                     kv_bandwidth=C.kv_bandwidth_of_gbps(np.exp(log_g).ravel()))
        return df["meets_slo"].to_numpy().reshape(log_g.shape)

    lo, hi = np.log(BW_SEARCH_GBPS)
    return search_boundary(ok, np.full(n_p.size, lo), np.full(n_p.size, hi),
                           increasing=True, rel_tol=C.search_tol(), points=C.search_points(n_p.size)).value


def break_even(designs, wl, base: dict) -> pd.DataFrame:
    """Bandwidths below which each Splitwise design stops paying off against the baselines.

    * throughput: its iso-power cluster no longer meets every SLO at the rate
      Baseline-H100's iso-power cluster sustains (so its throughput at SLO falls below);
    * cost: no split of the best baseline's budget ($/h at 70 req/s) meets every SLO at
      70 req/s.
    """
    best_cost = min(b["cost_at_target"] for b in base.values())
    thr_h100 = base["baseline-h100"]["throughput_at_slo"]
    rows = []
    for d in designs:
        n_p, n_t = C.iso_power_pools(d, "coding")
        up, ut = C.machine_cost(d)
        shares = prompt_shares()
        n = best_cost / (shares * up + (1.0 - shares) * ut)
        for mode in modes():
            c = C.cluster(d, transfer_mode=mode)
            g_thr = float(min_bandwidth_gbps(c, wl, n_p, n_t, thr_h100)[0])
            g_cost = min_bandwidth_gbps(c, wl, n * shares, n * (1.0 - shares), TARGET_RATE)
            rows.append(dict(design=d, mode=mode, throughput_breakeven_gbps=g_thr,
                             cost_breakeven_gbps=float(np.min(g_cost)),
                             cost_breakeven_prompt_share=float(shares[int(np.argmin(g_cost))]),
                             best_baseline_cost=best_cost, baseline_h100_throughput=thr_h100))
    return pd.DataFrame(rows)


def optimum_sensitivity(points, elast: pd.DataFrame, wl) -> pd.DataFrame:
    """Cost-at-target elasticities w.r.t. GPU specs at 400 Gbps (from the cost-boundary Jacobians)."""
    cols = [c for c in elast.columns if c.startswith("cost_elasticity_")]
    if not cols:
        return pd.DataFrame()
    at = elast[np.isclose(elast["gbps_per_gpu"], C.IB_GBPS_PER_GPU)][["design", "mode"] + cols]
    return at.rename(columns={c: c.replace("cost_elasticity_", "") for c in cols})


def claims(breakeven: pd.DataFrame) -> list[dict]:
    rows = []
    for _, r in breakeven.iterrows():
        ok10 = max(r["cost_breakeven_gbps"], r["throughput_breakeven_gbps"]) <= C.IB_GBPS_PER_GPU / 10.0
        rows.append({"claim": f"{r['design']} {r['mode']}: pays off at a 10x slower link (40 Gbps/GPU)?",
                     "paper": "estimated yes", "ours": "yes" if ok10 else "no",
                     "note": f"break-even: cost {r['cost_breakeven_gbps']:.3g}, throughput "
                             f"{r['throughput_breakeven_gbps']:.3g} Gbps/GPU"})
    return rows


def plot(sweep: pd.DataFrame, base: dict, args):
    plt = C.pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(18, 4.6))
    for (d, mode), g in sweep.groupby(["design", "mode"], sort=False):
        ls = "-" if mode == "serialized" else "--"
        ax[0].plot(g["gbps_per_gpu"], g["throughput_at_slo"], ls, marker="o", ms=3, color=C.COLOURS[d],
                   label=f"{d} {mode}")
        ax[1].plot(g["gbps_per_gpu"], g["cost_at_target"], ls, marker="o", ms=3, color=C.COLOURS[d])
        ax[2].plot(g["gbps_per_gpu"], g["e2e_p50_s"], ls, marker="o", ms=3, color=C.COLOURS[d])
        ax[2].plot(g["gbps_per_gpu"], g["e2e_p99_s"], ls, marker="^", ms=3, color=C.COLOURS[d], alpha=0.5)
    for d, b in base.items():
        ax[0].axhline(b["throughput_at_slo"], color=C.COLOURS[d], ls=":", label=f"{d} (no transfer)")
        ax[1].axhline(b["cost_at_target"], color=C.COLOURS[d], ls=":")
    for a in ax:
        a.axvline(C.IB_GBPS_PER_GPU, color="k", lw=0.8)
        a.axvline(C.IB_GBPS_PER_GPU / 10, color="k", lw=0.8, ls="-.")
        C.log_axis(a, (4, 40, 400, 4000))
        a.set_xlabel("KV link per GPU (Gbps); solid line: InfiniBand, dash-dot: 10x slower")
    ax[0].set(ylabel="throughput at SLO (req/s)", title="iso-power clusters (sized at 400 Gbps)")
    ax[1].set(ylabel="$/h", yscale="log", title=f"cheapest cluster meeting SLOs at {TARGET_RATE:g} req/s")
    ax[2].set(ylabel="E2E (s): P50 (o), P99 (^)", yscale="log", title="E2E at 80% of IB throughput at SLO")
    ax[0].legend(fontsize=6, ncol=2)
    fig.suptitle("KV-link bandwidth sensitivity, coding, BLOOM-176B" + (" [SMOKE]" if C.SMOKE else ""))
    return C.savefig(fig, args.out / "bandwidth_sensitivity.png")


if __name__ == "__main__":
    sys.exit(main())
