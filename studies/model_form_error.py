"""Derive the cluster model's model-form error from the validation runs (issue 14).

Reads the per-run relative errors that ``studies/validate_cluster.py`` writes
(``validation_runs.csv``: ours / SplitwiseSim - 1 per latency percentile, per phase-
timing mode, with our predicted prompt-pool load) and writes the spread the
uncertainty layer uses (`splitwise_jax.uncertainty.model_form_from_runs`): per mode,
metric, percentile and load bin, the s.d. of a zero-centred log-normal whose 90%
interval covers 90% of the runs (for intervals) and the one-sided s.d. that 90% of the
runs are under-predicted by less (for SLO probabilities), with the runs' count, bias
and RMS for the record.

Usage:
    python studies/validate_cluster.py                      # writes studies/out/validation_runs.csv
    python studies/model_form_error.py [--runs CSV] [--out JSON]
    SPLITWISE_SMOKE=1 python studies/model_form_error.py    # a synthetic table, no output file (CI)

The default output is the shipped ``splitwise_jax/data/model_form_error.json``; rerun both
scripts whenever the cluster model changes (docs/uncertainty.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from splitwise_jax.uncertainty import METRICS, MODEL_FORM_FILE, PCTS, load_model_form, model_form_from_runs

HERE = Path(__file__).resolve().parent
SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
RHO_EDGES = (0.0, 0.8)  # light / heavy prompt-pool load: validate_cluster.py's bins, merged to two


def _synthetic(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    d = {"mode": "calibrated", "rho_prompt": rng.uniform(0.1, 1.2, n)}
    for m in METRICS:
        for p in PCTS:
            d[f"err_{m}_{p}"] = np.expm1(rng.normal(0.0, 0.1 + 0.2 * (d["rho_prompt"] > 0.8)))
    return pd.DataFrame(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default=str(HERE / "out" / "validation_runs.csv"),
                    help="validation_runs.csv of studies/validate_cluster.py")
    ap.add_argument("--out", default=str(MODEL_FORM_FILE), help="JSON to write (default: the shipped one)")
    ap.add_argument("--level", type=float, default=0.9, help="interval level the spread is matched at")
    args = ap.parse_args(argv)
    if SMOKE:
        runs, source = _synthetic(), "synthetic (SPLITWISE_SMOKE)"
    else:
        path = Path(args.runs)
        if not path.is_file():
            print(f"{path} not found: run `python studies/validate_cluster.py` first", file=sys.stderr)
            return 2
        runs, source = pd.read_csv(path), path.name
    content = model_form_from_runs(runs, level=args.level, rho_edges=RHO_EDGES)
    content = {"about": "Model-form error of the cluster model vs SplitwiseSim: per phase-timing mode, metric, "
                        "percentile and predicted prompt-pool load bin (lower edges rho_edges), the s.d. of a "
                        "zero-centred log-normal of ours / reference whose central interval at `level` covers "
                        "that share of the validation runs; n, bias (mean log error) and rms per bin for the "
                        "record. Derived, not typed: python studies/model_form_error.py (docs/uncertainty.md).",
               "source": source, "generated_by": "python studies/model_form_error.py", **content}
    lines = [f"{'mode':<20}{'metric':<10}" + "".join(f"{f'rho>={e:g}':>12}" for e in content["rho_edges"])
             + "".join(f"{f'SLO rho>={e:g}':>14}" for e in content["rho_edges"])]
    for mode, table in content["modes"].items():
        for key, v in table.items():
            lines.append(f"{mode:<20}{key:<10}" + "".join(f"{s:>12.3f}" for s in v["log_sd"])
                         + "".join(f"{s:>14.3f}" for s in v["log_sd_slo"]))
    print("model-form log s.d.: two-sided (90% interval = x exp(+-1.645 sd)); one-sided for SLO probabilities:")
    print("\n".join(lines))
    if SMOKE:
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(content, indent=1) + "\n")
    load_model_form(out)  # what was written reads back
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
