"""Shared plumbing of the paper-reproduction studies (GitHub issue 6).

Every study script is the outer edge of the package (a script: argparse, printing and
files live here, never in the library): it parses arguments,
runs sweeps through the helpers below, prints a "paper vs ours" table and writes a PNG
and a CSV into ``studies/out/<study>/`` (``--out`` overrides).

Smoke mode (``SPLITWISE_SMOKE=1`` in the environment, as jax-md's examples use
``SMOKE_TEST``) makes every study small enough for CI: workloads coarsened to 8 x 8
request classes and few grid points. Numbers printed in
smoke mode are labelled as such; only full runs go into studies/README.md. Smoke and
full runs take the same code path: sizing is always `splitwise_jax.optimize` (there is
no second solver here), and the highest rate meeting the SLOs is always the package's
`splitwise_jax.optimize.search_boundary`. A failure of either fails the study.

Speed. `evaluate` compiles in ~10 s per program, then costs a few ms per point, so the
helpers here funnel everything through a handful of programs:

* `sweep` maps one jitted `evaluate` (`lax.map`, a row at a time) over pool sizes,
  arrival rate and KV bandwidth in fixed-size chunks (one compile per design kind,
  transfer mode and model, reused by every chunk and every design of that kind: static
  names are made uniform, and workloads are padded to one class grid);
* `margin_jacobian` is the one jitted derivative program: the Jacobian, with respect to
  log-multipliers of rate, pool sizes, KV bandwidth, HBM bandwidth, FLOP/s and power
  caps, of the log latency percentiles, log throughput, log power and the worst SLO
  margin. Elasticities and the implicit-function sensitivities of throughput at SLO
  and of cost at a target load are read off it.

Set ``JAX_COMPILATION_CACHE_DIR`` (and ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``)
to reuse compiled programs across scripts, as tests/test_studies.py does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import jax

# Latency percentiles span 10 ms to minutes and the derivative programs take logs:
# float64 keeps the studies about the model, not the arithmetic.
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import splitwise_jax as sj  # noqa: E402
from splitwise_jax._batching import map_blocks  # noqa: E402
from splitwise_jax.cluster import metrics as _metrics  # noqa: E402
from splitwise_jax.optimize import (OptimizeResult, Problem, SolverConfig, optimize, reference_budget,  # noqa: E402
                                    search_boundary)

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
HORIZON_S = 120.0  # the paper's and SplitwiseSim's 2-minute traces
# Smoke runs keep the package's default resolution too. A coarser one (4 window, 32
# table points) once halved compile time; measured 2026-12-01 on the 2-core machine it
# no longer does (fig18_19 smoke 93 s coarse vs 98 s default, bandwidth 72 vs 70 s,
# fresh caches: XLA compiles the same loops either way), while the default lets a smoke
# run load the optimiser programs tests/test_optimize.py compiles (same 8 x 8 class grid)
# from the suite's shared compilation cache: Splitwise-HH's first sizing 47 -> 6 s.
RESOLUTION = sj.Resolution()
CHUNK = 16 if SMOKE else 64
# Full runs also compile an 8-wide program for small calls (a single configuration's
# rate search would otherwise pad 1 point to 64); smoke runs keep one program.
SMALL_CHUNK = CHUNK if SMOKE else 8
_SMOKE_BINS = 8
_FULL_SHAPE = (32, 32)  # coding has 28 x 32 classes, conversation 32 x 32: pad to one grid
STUDIES_DIR = Path(__file__).resolve().parent
SPLITWISE = tuple(d for d, s in sj.DESIGNS.items() if s.strategy.token_pool)
BASELINES = tuple(d for d, s in sj.DESIGNS.items() if not s.strategy.token_pool)
ALL_DESIGNS = BASELINES + SPLITWISE
COLOURS = {"baseline-a100": "tab:gray", "baseline-h100": "black", "splitwise-aa": "tab:blue",
           "splitwise-hh": "tab:red", "splitwise-ha": "tab:green", "splitwise-hhcap": "tab:orange"}
METRICS = _metrics.METRICS  # ("ttft", "tbt", "e2e")
PCTS = _metrics.KEYS  # ("p50", "p90", "p99")
LATENCY_COLS = tuple(f"{m}_{p}_s" for m in METRICS for p in PCTS)
SLOWDOWN_COLS = tuple(f"slowdown_{m}_{p}" for m in METRICS for p in PCTS)
SCALAR_COLS = _metrics.SCALAR_FIELDS
IB_GBPS_PER_GPU = 400.0  # the paper's H100 InfiniBand link (Table I)
KV_LINK_EFF = 0.9  # the phase model's kv_link_eff prior (docs/model.md section 6)


# --------------------------------------------------------------------------------------
# Command line and output


def parse_args(study: str, doc: str | None, argv=None, extra=None) -> argparse.Namespace:
    """``--out`` (default studies/out/<study>/) plus any study-specific options."""
    ap = argparse.ArgumentParser(description=(doc or study).strip().split("\n")[0])
    ap.add_argument("--out", default=str(STUDIES_DIR / "out" / study), help="output folder")
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def banner(study: str) -> float:
    mode = "SMOKE (small, fast; numbers are indicative only)" if SMOKE else "full"
    print(f"== {study}: {mode} run; jax {jax.__version__}, float64 ==", flush=True)
    return time.perf_counter()


def done(study: str, t0: float, paths: Sequence[Path]) -> None:
    print(f"{study}: wrote " + ", ".join(str(p) for p in paths) + f" in {time.perf_counter() - t0:.1f} s")


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False, float_format="%.6g")
    return path


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (scripts and CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def savefig(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def log_axis(ax, ticks, axis: str = "x") -> None:
    """A log axis labelled at `ticks` only (matplotlib's minor labels collide)."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    a.set_major_locator(FixedLocator(list(ticks)))
    a.set_major_formatter(lambda v, _: f"{v:g}")
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        a = abs(float(v))
        return f"{v:.3g}" if a < 1e4 else f"{v:.4g}"
    return str(v)


def paper_vs_ours(rows: Sequence[dict], title: str) -> pd.DataFrame:
    """Print (and return) a table of the paper's figure beside ours.

    Each row: ``claim`` (what is compared), ``paper`` and ``ours`` (numbers or text),
    optional ``unit`` and ``note``. The difference is ``ours / paper - 1`` when both
    are positive numbers, else left blank.
    """
    out = []
    for r in rows:
        p, o = r.get("paper"), r.get("ours")
        diff = np.nan
        if isinstance(p, (int, float, np.number)) and isinstance(o, (int, float, np.number)) and p and np.isfinite(o):
            diff = float(o) / float(p) - 1.0
        out.append({"claim": r["claim"], "paper": p, "ours": o, "unit": r.get("unit", ""),
                    "ours_over_paper_minus_1": diff, "note": r.get("note", "")})
    df = pd.DataFrame(out)
    head = f"{title}{'  [SMOKE numbers]' if SMOKE else ''}"
    print("\n" + head + "\n" + "-" * len(head))
    w = max(len(str(c)) for c in df["claim"]) if len(df) else 10
    print(f"{'claim':<{w}}  {'paper':>12}  {'ours':>12}  {'diff':>8}  unit / note")
    for _, r in df.iterrows():
        d = "" if not np.isfinite(r["ours_over_paper_minus_1"]) else f"{r['ours_over_paper_minus_1']:+.0%}"
        note = " ".join(x for x in (r["unit"], r["note"]) if x)
        print(f"{r['claim']:<{w}}  {_fmt(r['paper']):>12}  {_fmt(r['ours']):>12}  {d:>8}  {note}")
    sys.stdout.flush()
    return df


def print_frame(df: pd.DataFrame, title: str, cols: Sequence[str] | None = None) -> None:
    print("\n" + title + ("  [SMOKE numbers]" if SMOKE else ""))
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.float_format", "{:.4g}".format):
        print((df if cols is None else df[list(cols)]).to_string(index=False))
    sys.stdout.flush()


# --------------------------------------------------------------------------------------
# Workloads and clusters


def study_workload(name: str, rate_per_s: float = 70.0) -> sj.Workload:
    """A preset workload on the studies' common class grid.

    Full runs: the preset's ~30 x 32 classes padded with zero-weight classes to 32 x 32
    (percentiles unchanged) so coding and conversation share compiled programs. Smoke
    runs: coarsened to 8 x 8 classes (tails move by ~10-30%; see `coarsen`).
    """
    wl = sj.load_workload(name, rate_per_s)
    if SMOKE:
        wl = sj.coarsen(wl, _SMOKE_BINS, _SMOKE_BINS)
        shape = (_SMOKE_BINS, _SMOKE_BINS)
    else:
        shape = _FULL_SHAPE
    return _pad(wl, *shape)


def _pad(wl: sj.Workload, k: int, m: int) -> sj.Workload:
    k0, m0 = wl.weights.shape
    if k0 > k or m0 > m:
        raise ValueError(f"workload {wl.name} has {k0} x {m0} classes, more than the grid {k} x {m}")
    p = jnp.concatenate([wl.prompt_tokens, jnp.full(k - k0, wl.prompt_tokens[-1])])
    o = jnp.concatenate([wl.output_tokens, jnp.full(m - m0, wl.output_tokens[-1])])
    w = jnp.pad(wl.weights, ((0, k - k0), (0, m - m0)))
    return dataclasses.replace(wl, prompt_tokens=p, output_tokens=o, weights=w, name="study")


def cluster(design: str, n_prompt: float = 1.0, n_token: float = 1.0, **kw) -> sj.Cluster:
    """`make_cluster` with uniform static names (pool sizes are replaced by sweeps)."""
    split = sj.DESIGNS[design].strategy.token_pool
    return sj.uniform_names(sj.make_cluster(design, n_prompt, n_token if split else 0.0, **kw))


def is_baseline(design: str) -> bool:
    return not sj.DESIGNS[design].strategy.token_pool


def kv_bandwidth_of_gbps(gbps_per_gpu, gpus: int = 8, link_eff: float = KV_LINK_EFF):
    """Transfer bandwidth (bytes/s) of a machine whose GPUs each have `gbps_per_gpu` links."""
    return np.asarray(gbps_per_gpu, float) * 1e9 / 8.0 * gpus * link_eff


def machine_cost(design: str) -> tuple[float, float]:
    """($/h of a prompt machine, of a token machine) of a design."""
    c = sj.make_cluster(design, 1.0, 1.0 if not is_baseline(design) else 0.0)
    return float(c.prompt.machine.cost_per_hour), float(c.token.machine.cost_per_hour)


def machine_power_kw(design: str) -> tuple[float, float]:
    """(provisioned kW of a prompt machine, of a token machine, at their caps)."""
    c = sj.make_cluster(design, 1.0, 1.0 if not is_baseline(design) else 0.0)
    return (float(sj.provisioned_power_w(c.prompt.machine, c.prompt.cap_frac)) / 1e3,
            float(sj.provisioned_power_w(c.token.machine, c.token.cap_frac)) / 1e3)


# --------------------------------------------------------------------------------------
# Sweeps


def _with(c: sj.Cluster, n_p, n_t, bw) -> sj.Cluster:
    return c.replace(n_prompt=n_p, n_token=n_t,
                     transfer=dataclasses.replace(c.transfer, bandwidth_bytes_per_s=bw))


@jax.jit
def _sweep_chunk(c: sj.Cluster, wl: sj.Workload, n_p, n_t, rate, bw):
    def one(n_p, n_t, rate, bw):
        return sj.evaluate(_with(c, n_p, n_t, bw), wl.with_rate(rate), HORIZON_S, resolution=RESOLUTION)

    # lax.map, not vmap: on CPU a row at a time runs faster (the model's inner loops stop
    # per row) and compiles faster (splitwise_jax.sweep.default_batch_size).
    return jax.lax.map(lambda a: one(*a), (n_p, n_t, rate, bw))


def sweep(c: sj.Cluster, wl: sj.Workload, *, n_prompt=None, n_token=None, rate=None, kv_bandwidth=None) -> pd.DataFrame:
    """Evaluate `c` on `wl` at many points; arguments broadcast to one 1-D length.

    Args:
        c: a cluster (from `cluster`); its own values fill any argument left None.
        wl: workload; its rate fills `rate` when None.
        n_prompt, n_token: pool sizes (a baseline's machines are n_prompt).
        rate: arrival rate (req/s).
        kv_bandwidth: KV transfer bandwidth (bytes/s).

    Returns:
        One row per point: the inputs, ``{ttft,tbt,e2e}_{p50,p90,p99}_s``,
        ``slowdown_*``, ``min_margin`` (worst log(limit / slowdown); > 0 meets every
        SLO), ``meets_slo`` and the scalar metrics of `ClusterMetrics`.
    """
    cols = [n_prompt if n_prompt is not None else c.n_prompt, n_token if n_token is not None else c.n_token,
            rate if rate is not None else wl.rate_per_s,
            kv_bandwidth if kv_bandwidth is not None else c.transfer.bandwidth_bytes_per_s]
    cols = [np.ravel(np.asarray(x, float)) for x in np.broadcast_arrays(*[np.asarray(x, float) for x in cols])]
    chunk = SMALL_CHUNK if cols[0].size <= SMALL_CHUNK else CHUNK
    m = map_blocks(lambda *xs: _sweep_chunk(c, wl, *(jnp.asarray(x) for x in xs)), cols, chunk)
    return metrics_frame(m, dict(n_prompt=cols[0], n_token=cols[1], rate=cols[2], kv_bandwidth_bytes_per_s=cols[3]))


metrics_frame = _metrics.metrics_frame  # `ClusterMetrics` with a leading point axis as a flat DataFrame


#: Share of the offered rate a cluster must serve to count as keeping up (`capacity`).
KEEP_UP = 0.98


def _ok(df: pd.DataFrame, criterion: str) -> np.ndarray:
    if criterion == "slo":
        return df["meets_slo"].to_numpy()
    return (df["throughput_rps"] >= KEEP_UP * df["rate"]).to_numpy()


def search_points(n: int) -> int:
    """Values asked per problem and step of `search_boundary` for n problems: enough to
    fill one small sweep chunk (a single configuration then costs ~4 sweep calls
    instead of ~12 bisection steps)."""
    return max(1, SMALL_CHUNK // n) if n <= SMALL_CHUNK else 1


def search_tol() -> float:
    """Relative resolution of the studies' boundary searches (0.5% smoke, 0.05% full)."""
    return 5e-3 if SMOKE else 5e-4


def throughput_at_slo(c: sj.Cluster, wl: sj.Workload, n_prompt, n_token=0.0, *, kv_bandwidth=None, r_lo: float = 1.0,
                      r_hi: float = 400.0, criterion: str = "slo") -> np.ndarray:
    """The highest arrival rate at which each configuration meets every SLO (req/s).

    The package's `search_boundary` in log rate (feasibility is taken as monotone in the
    rate, as the optimiser takes it). Returns 0 where even `r_lo` fails and `r_hi` where
    `r_hi` still meets.

    Args:
        criterion: "slo" (all nine Table VI limits hold) or "capacity" (the cluster
            serves at least `KEEP_UP` of the offered rate: no SLO, batch jobs).
    """
    if criterion not in ("slo", "capacity"):
        raise ValueError(f"criterion must be 'slo' or 'capacity', got {criterion!r}")
    bw0 = c.transfer.bandwidth_bytes_per_s if kv_bandwidth is None else kv_bandwidth
    n_p, n_t, bw = np.broadcast_arrays(*(np.asarray(x, float) for x in (n_prompt, n_token, bw0)))
    shape = n_p.shape
    n_p, n_t, bw = n_p.ravel(), n_t.ravel(), bw.ravel()

    def ok(rows, log_r):
        k = log_r.shape[1]
        df = sweep(c, wl, n_prompt=np.repeat(n_p[rows], k), n_token=np.repeat(n_t[rows], k),
                   rate=np.exp(log_r).ravel(), kv_bandwidth=np.repeat(bw[rows], k))
        return _ok(df, criterion).reshape(log_r.shape)

    found = search_boundary(ok, np.full(n_p.size, np.log(r_lo)), np.full(n_p.size, np.log(r_hi)),
                            rel_tol=search_tol(), points=search_points(n_p.size))
    return found.value.reshape(shape)


# --------------------------------------------------------------------------------------
# Derivatives

#: Log-multipliers differentiated by `margin_jacobian`, in order.
THETA = ("rate", "pools", "kv_bw", "hbm_bw_prompt", "hbm_bw_token", "flops_prompt", "flops_token",
         "cap_prompt", "cap_token")
#: Outputs of `margin_jacobian`, in order (log of each, except the margin).
OUTPUTS = ("min_margin",) + tuple(f"log_{c}" for c in LATENCY_COLS) + ("log_throughput_rps", "log_power_kw")


def _scale_timing(t, hbm, flops, cap):
    gpu = t.machine.gpu
    gpu = dataclasses.replace(gpu, hbm_bw_bytes_per_s=gpu.hbm_bw_bytes_per_s * hbm,
                              peak_flops_per_s=gpu.peak_flops_per_s * flops)
    return dataclasses.replace(t, machine=t.machine.replace(gpu=gpu), cap_frac=t.cap_frac * cap)


def _outputs(theta, c: sj.Cluster, wl: sj.Workload):
    e = dict(zip(THETA, jnp.exp(theta)))
    c = c.replace(prompt=_scale_timing(c.prompt, e["hbm_bw_prompt"], e["flops_prompt"], e["cap_prompt"]),
                  token=_scale_timing(c.token, e["hbm_bw_token"], e["flops_token"], e["cap_token"]),
                  n_prompt=c.n_prompt * e["pools"], n_token=c.n_token * e["pools"],
                  transfer=dataclasses.replace(c.transfer, bandwidth_bytes_per_s=c.transfer.bandwidth_bytes_per_s
                                               * e["kv_bw"]))
    m = sj.evaluate(c, wl.with_rate(wl.rate_per_s * e["rate"]), HORIZON_S, resolution=RESOLUTION)
    lat = jnp.log(jnp.concatenate([m.ttft_s, m.tbt_s, m.e2e_s]))
    # The worst margin: `min` sends the gradient to the binding SLO (a.e. unique).
    return jnp.concatenate([jnp.min(m.slo_margin)[None], lat, jnp.log(m.throughput_rps)[None],
                            jnp.log(m.power_kw)[None]])


# Forward mode: 9 inputs, 12 outputs, one program per design kind. Each point is
# linearised once (`jax.linearize`: the model evaluated once) and its linear map applied
# to the 9 basis vectors with `lax.map`, the points themselves with `lax.map` too: on
# CPU the model's inner loops batch poorly (as `sweep` found). Against `jax.jacfwd`
# under `vmap` (smoke workload, 16 points, 2-core machine, same Jacobian to 1.7e-12):
# tracing 11.5 -> 4.7 s, compiling 45.6 -> 24.9 s, running 0.15 -> 0.08 s (XLA's
# defaults); 11.8 -> 5.6, 26.4 -> 13.1 and 0.39 -> 0.25 s with the test suite's flags.
@jax.jit
def _jacobian_chunk(c: sj.Cluster, wl: sj.Workload, n_p, n_t, rate, bw):
    def one(point):
        n_p, n_t, rate, bw = point
        args = (_with(c, n_p, n_t, bw), wl.with_rate(rate))
        value, jvp = jax.linearize(lambda theta: _outputs(theta, *args), jnp.zeros(len(THETA)))
        return value, jax.lax.map(jvp, jnp.eye(len(THETA))).T

    return jax.lax.map(one, (n_p, n_t, rate, bw))


def margin_jacobian(c: sj.Cluster, wl: sj.Workload, n_prompt, n_token, rate,
                    kv_bandwidth=None) -> tuple[np.ndarray, np.ndarray]:
    """Values and Jacobians of `OUTPUTS` w.r.t. the log-multipliers `THETA` at each point.

    Arguments broadcast to one 1-D length (padded to `CHUNK`s like `sweep`).

    Returns:
        (values (n, len(OUTPUTS)), jacobian (n, len(OUTPUTS), len(THETA))). Row
        ``log_x``, column ``kv_bw`` is the elasticity d log x / d log bandwidth.
    """
    bw0 = c.transfer.bandwidth_bytes_per_s if kv_bandwidth is None else kv_bandwidth
    cols = np.broadcast_arrays(*(np.asarray(x, float) for x in (n_prompt, n_token, rate, bw0)))
    cols = [x.ravel() for x in cols]
    return map_blocks(lambda *xs: _jacobian_chunk(c, wl, *(jnp.asarray(x) for x in xs)), cols, CHUNK)


def implicit_sensitivities(jac: np.ndarray) -> dict[str, np.ndarray]:
    """Sensitivities of the SLO boundary, by the implicit function theorem.

    At a point on the boundary (worst margin g = 0), moving a parameter theta_i moves:
    * the throughput at SLO: d log r* / d theta_i = -g_i / g_rate;
    * the cost at a target load, re-sizing all pools in proportion:
      d log C* / d theta_i = -g_i / g_pools. By the envelope theorem this is also the
      first-order change of the cost-optimal (continuous) pool sizes' cost, since at
      that optimum the cost gradient is parallel to the margin's (grad C = mu grad g,
      mu = C / g_pools along the pools' own direction).

    Args:
        jac: (n, len(OUTPUTS), len(THETA)) from `margin_jacobian`, evaluated on the boundary.

    Returns:
        {"throughput_at_slo": (n, len(THETA)), "cost_at_target": (n, len(THETA))}.
    """
    g = jac[:, 0, :]
    g_rate = g[:, THETA.index("rate")][:, None]
    g_pools = g[:, THETA.index("pools")][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"throughput_at_slo": -g / g_rate, "cost_at_target": -g / g_pools}


# --------------------------------------------------------------------------------------
# Sizing


def iso_power_budget_kw() -> float:
    """The paper's iso-power budget: 40 DGX-H100 (~ 70 DGX-A100), provisioned kW
    (`optimize.reference_budget`, from `paper.ISO_REFERENCE_MACHINES`)."""
    return reference_budget()[0]


def iso_cost_budget() -> float:
    """Iso-cost budget: the cost of 40 DGX-H100 ($/h) (`optimize.reference_budget`)."""
    return reference_budget()[1]


# Smoke runs skip the sizing search (it costs more than the smoke budget): these are the
# iso-power throughput-optimised splits `iso_power_pools` found in the full run recorded
# in studies/README.md (40 DGX-H100 of provisioned power; an A100 machine is 24.8/44 of
# an H100's; coding rows from the 0db27a8 rerun). A model change can move the true optimum; full runs always search.
_SMOKE_ISO_POWER = {
    ("coding", "baseline-a100"): (70.0, 0.0), ("coding", "baseline-h100"): (40.0, 0.0),
    ("coding", "splitwise-aa"): (55.0, 15.0), ("coding", "splitwise-hh"): (34.0, 6.0),
    ("coding", "splitwise-ha"): (30.0, 17.0), ("coding", "splitwise-hhcap"): (35.0, 7.0),
    ("conversation", "baseline-a100"): (70.0, 0.0), ("conversation", "baseline-h100"): (40.0, 0.0),
    ("conversation", "splitwise-aa"): (20.0, 50.0), ("conversation", "splitwise-hh"): (15.0, 25.0),
    ("conversation", "splitwise-ha"): (10.0, 53.0), ("conversation", "splitwise-hhcap"): (19.0, 30.0),
}
_SIZING: dict = {}


def solver_config() -> SolverConfig:
    """`optimize.SolverConfig` for the studies: the package's defaults at the studies'
    `Resolution`. Smoke runs also search rates to 0.5% (`search_tol`) instead of 0.05%
    (three bisection steps fewer per throughput candidate); they keep the default
    gradient steps: 2 rounds of 10 left Splitwise throughput problems 18% over their
    power budget and the integer repair with no feasible cell."""
    if SMOKE:
        return SolverConfig(resolution=RESOLUTION, rate_tol=search_tol())
    return SolverConfig(resolution=RESOLUTION)


def solve(design: str, wl: sj.Workload, problem: Problem, model: str = "bloom-176b") -> OptimizeResult:
    """`splitwise_jax.optimize.optimize` on one design (pool sizes are the optimiser's).

    Raises whatever the optimiser raises: a failure fails the study.
    """
    c = sj.make_cluster(design, 1.0, 0.0 if is_baseline(design) else 1.0, model=model)
    return optimize(c, wl, problem, solver_config())


SIZING_CACHE = STUDIES_DIR / "out" / "iso_power_sizing.csv"


def model_fingerprint(model: str = "bloom-176b") -> str:
    """A short hash of the model's predictions at two reference points.

    Sizing searches are cached on disk across study scripts; the cache is valid only
    while the model (phase parameters, cluster equations, workloads) is unchanged, which
    this fingerprint detects without reading any code.
    """
    import hashlib

    wl = study_workload("coding", 40.0)
    parts = []
    for d, n_p, n_t in (("baseline-h100", 40.0, 0.0), ("splitwise-ha", 20.0, 20.0)):
        df = sweep(cluster(d, model=model), wl, n_prompt=n_p, n_token=n_t)
        parts.append(np.round(df[list(LATENCY_COLS)].to_numpy(), 6).tobytes())
    return hashlib.sha1(b"".join(parts) + repr((SMOKE, RESOLUTION)).encode()).hexdigest()[:12]


def _read_sizing_cache(fp: str) -> dict:
    if not SIZING_CACHE.is_file():
        return {}
    try:
        df = pd.read_csv(SIZING_CACHE)
        df = df[df["fingerprint"] == fp]
    except (OSError, ValueError, KeyError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return {}  # a damaged or old-format cache is just recomputed
    return {(r.design, r.workload, r.model, round(float(r.budget_kw), 3)): (float(r.n_prompt), float(r.n_token))
            for r in df.itertuples()}


def _write_sizing_cache(fp: str, key, pools, method: str) -> None:
    row = pd.DataFrame([dict(fingerprint=fp, design=key[0], workload=key[1], model=key[2], budget_kw=key[3],
                             n_prompt=pools[0], n_token=pools[1], method=method)])
    SIZING_CACHE.parent.mkdir(parents=True, exist_ok=True)
    row.to_csv(SIZING_CACHE, mode="a", header=not SIZING_CACHE.is_file(), index=False)


def iso_power_pools(design: str, wl_name: str, model: str = "bloom-176b", *, search: bool | None = None):
    """(n_prompt, n_token) of a design's iso-power, throughput-optimised cluster.

    The paper's iso-power budget (40 DGX-H100); the split that maximises the rate at
    which every SLO holds, from `splitwise_jax.optimize` (throughput problem). Full runs
    cache the answer in ``studies/out/iso_power_sizing.csv``, keyed by
    `model_fingerprint`, so Figs. 16, 17, 20 and the bandwidth study size each design
    once. In smoke mode (unless `search`) a stored split (`_SMOKE_ISO_POWER`) stands in
    for the search.

    Raises:
        RuntimeError: the optimiser found no feasible cluster on the budget.
    """
    search = (not SMOKE) if search is None else search
    if not search and (wl_name, design) in _SMOKE_ISO_POWER:
        return _SMOKE_ISO_POWER[(wl_name, design)]
    budget = round(iso_power_budget_kw(), 3)
    key = (design, wl_name, model, budget)
    if key in _SIZING:
        return _SIZING[key]
    if not SMOKE and "fingerprint" not in _SIZING:
        _SIZING["fingerprint"] = model_fingerprint()
        _SIZING.update(_read_sizing_cache(_SIZING["fingerprint"]))
        if key in _SIZING:
            return _SIZING[key]
    t0 = time.perf_counter()
    res = solve(design, study_workload(wl_name), Problem("throughput", power_budget_kw=budget), model=model)
    if res.best is None:
        raise RuntimeError(f"optimize found no feasible iso-power cluster for {design} on {wl_name}")
    pools = (float(res.best.prompt_machines), float(res.best.token_machines))
    _SIZING[key] = pools
    if not SMOKE:
        _write_sizing_cache(_SIZING["fingerprint"], key, pools, "optimize")
    print(f"sized {design} for {wl_name} ({model}): {pools[0]:g} prompt + {pools[1]:g} token machines "
          f"(iso-power, throughput-optimised, optimize, {time.perf_counter() - t0:.0f} s)", flush=True)
    return pools
