"""The text table `evaluate` and `simulate` print for one cluster (no JAX: a warm
`simulate` prints it without importing JAX)."""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(d: dict, title: str) -> str:
    lines = [title, f"{'metric':<10}{'P50':>12}{'P90':>12}{'P99':>12}   slowdown P50/P90/P99"]
    for name in ("ttft", "tbt", "e2e"):
        t = d[f"{name}_s"]
        s = d["slowdown"][name]
        lines.append(f"{name.upper() + ' (s)':<10}{t['p50']:>12.4f}{t['p90']:>12.4f}{t['p99']:>12.4f}   "
                     f"{s['p50']:.2f} / {s['p90']:.2f} / {s['p99']:.2f}")
    u = d["utilisation"]
    lines += [
        f"meets all nine Table VI SLOs: {'yes' if d['meets_slo'] else 'no'}",
        f"throughput {d['throughput_rps']:.2f} req/s   cost ${d['cost_per_hour']:.2f}/h   "
        f"power {d['power_kw']:.1f} kW (provisioned {d['provisioned_power_kw']:.1f} kW)",
        f"prompt-pool load {u['prompt_pool_rho']:.2f}   token-pool batch {u['token_pool_mean_batch']:.1f}   "
        f"KV memory pressure {u['kv_memory_pressure']:.2f}",
        f"mixed pool: {100 * d['mixed_pool']['prompts_drafted_frac']:.1f}% prompts drafted, "
        f"{100 * d['mixed_pool']['decodes_moved_frac']:.1f}% decodes moved",
        f"status: {d['status']}",
    ]
    return "\n".join(lines)


def pool_lines(pools: list[dict]) -> list[str]:
    """Text lines saying each pool's machines and how far its phase timing is trusted."""
    lines = []
    for p in pools:
        pv = p["provenance"]
        err = pv["expected_mape_pct"]
        pct = ("unknown" if err["prompt"] is None else
               f"prompt {err['prompt']:.1f}%, token {err['token']:.1f}%{' (capped)' if pv['capped'] else ''}")
        head = (f"{p['role']} pool: {p['count']:g} x {p['machine']} ({p['gpu']}, tp {p['tp']}, "
                f"cap {100 * p['cap_frac']:.0f}%): ")
        stack = f"stack {pv.get('stack', 'paper-2023')}"
        if pv["calibrated"]:
            lines.append(head + f"calibrated phase parameters, {stack} (held-out error {pct})")
        else:
            lines.append(head + f"UNCALIBRATED: {pv['label']}, {stack}, expected error {pct} ({pv['basis']})")
        lines += [f"    note: {n}" for n in pv["notes"]]
    return lines


def title_head(design_name: str, pools: list[dict], describe: str, llm_name: str) -> str:
    """The start of a cluster's one-line title: "splitwise-hh (27 prompt dgx-h100, 3 token
    dgx-h100), bloom-176b, " (`describe`: what the design adds, e.g. its chunk budget)."""
    what = ", ".join(f"{p['count']:g} {p['role']} {p['machine']}" for p in pools)
    return f"{design_name} ({what}{describe}), {llm_name}, "
