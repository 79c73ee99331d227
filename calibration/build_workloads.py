"""Regenerates the workload presets in splitwise_jax/data/workloads from the Azure traces.

Reads the Azure 2023 LLM inference traces from the shared folder (never copies them)
and writes, per preset, the compact distribution of `Workload.from_samples` with the
default bins: support points, marginal and joint weights, plus summary statistics of
the trace (length, span, measured rate and inter-arrival cv2, means and percentiles)
so that tests can check the presets without the shared folder. No trace rows are
written.

Usage:
    python calibration/build_workloads.py [--check]

``--check`` rebuilds in memory and exits non-zero if a shipped file differs.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

# The support points are bin means; float64 keeps them (and the means) exact.
jax.config.update("jax_enable_x64", True)

from splitwise_jax._paths import azure_trace_csv  # noqa: E402
from splitwise_jax.cluster.workload import _PRESET_DIR, Workload, load_trace  # noqa: E402

SOURCE = (
    "Azure LLM inference trace 2023 (github Azure/AzurePublicDataset, {file}), CC-BY 4.0; "
    "Patel et al., Splitwise, ISCA 2024"
)
PERCENTILES = (50, 90, 99)


def build(preset: str) -> dict:
    """The JSON record of one preset ("coding" or "conversation")."""
    path = azure_trace_csv(preset)
    trace = load_trace(path)
    joint = Workload.from_trace(trace, arrival="trace", independent=False, name=preset)
    prompt = trace["prompt_tokens"].to_numpy()
    output = trace["output_tokens"].to_numpy()
    arrival = trace["arrival_s"].to_numpy()
    return {
        "name": preset,
        "source": SOURCE.format(file=path.name),
        "binning": "quantile bins of consecutive ranks, support point = bin mean "
        "(splitwise_jax.cluster.workload.Workload.from_samples, default bins)",
        "prompt_tokens": np.asarray(joint.prompt_tokens).tolist(),
        "output_tokens": np.asarray(joint.output_tokens).tolist(),
        "prompt_weights": np.asarray(joint.prompt_weights).tolist(),
        "output_weights": np.asarray(joint.output_weights).tolist(),
        "joint_weights": np.asarray(joint.weights).tolist(),
        "trace": {
            "n_requests": int(trace.shape[0]),
            "span_s": float(arrival[-1] - arrival[0]),
            "rate_per_s": float(joint.rate_per_s),
            "arrival_cv2": float(joint.arrival_cv2),
            "mean_prompt_tokens": float(prompt.mean()),
            "mean_output_tokens": float(output.mean()),
            "prompt_percentiles": {str(q): float(np.percentile(prompt, q)) for q in PERCENTILES},
            "output_percentiles": {str(q): float(np.percentile(output, q)) for q in PERCENTILES},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    stale = []
    for preset in ("coding", "conversation"):
        record = build(preset)
        # One top-level key per line: readable diffs without one number per line.
        text = "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in record.items())
        text += "\n}\n"
        target = _PRESET_DIR / f"{preset}.json"
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target} ({len(text)} bytes)")
    for target in stale:
        print(f"{target} is out of date; run calibration/build_workloads.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
