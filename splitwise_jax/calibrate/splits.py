"""Held-out splits of the profiles and the fits that predict them, beside
SplitwiseSim's own interpolation as the baseline.

Each split returns (train config_ids, test config_ids) over the medians with the
flagged outliers removed from both sides (they are reported, not scored).

References:
    Patel et al., Splitwise, ISCA 2024, §V-A (SplitwiseSim's piecewise-linear
    performance model: "MAPE < 3% on an 80:20 split").
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from splitwise_jax.calibrate.fit import FitConfig, fit, outlier_ids
from splitwise_jax.calibrate.intervals import predict_intervals
from splitwise_jax.calibrate.laplace import laplace
from splitwise_jax.calibrate.rows import gpu_of_hardware, predict_frame
from splitwise_jax.specs.catalog import MACHINE_OF_HARDWARE, get_machine
from splitwise_jax.phases.profiles import CONFIG_KEYS, SERIES_KEYS

SPLITS = ("random", "extrapolation", "spec_transfer")
SPLIT_LABELS = {
    "random": "(a) random 80:20 over configurations",
    "extrapolation": "(b) extrapolation: largest batch-token levels held out",
    "spec_transfer": "(c) spec transfer: fit on A100, predict H100 from its spec sheet",
}


def _clean(medians: pd.DataFrame) -> pd.DataFrame:
    return medians[~medians["config_id"].isin(outlier_ids(medians))]


def split_random(medians: pd.DataFrame, seed: int, test_frac: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(a) A random `test_frac` of the distinct configurations (not rows) held out.

    The triplicated 512 x 1 x 128 block is one configuration, so its repeats never
    straddle the split.
    """
    ids = np.sort(_clean(medians)["config_id"].to_numpy())
    rng = np.random.default_rng(seed)
    perm = rng.permutation(ids)
    n_test = int(round(test_frac * len(ids)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def split_extrapolation(medians: pd.DataFrame, levels: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(b) Per (model, hardware, TP), the configurations at the `levels` largest
    batch-token counts held out (16,384 and 32,768 in the shipped grid: prompt 512 at
    batch 32 and 64), everything below fitted."""
    med = _clean(medians)
    rank = med.groupby(list(SERIES_KEYS))["batch_tokens"].rank(method="dense", ascending=False)
    test = med["config_id"][rank <= levels].to_numpy()
    train = med["config_id"][rank > levels].to_numpy()
    return np.sort(train), np.sort(test)


def split_spec_transfer(medians: pd.DataFrame, train_gpu: str = "a100-80gb") -> tuple[np.ndarray, np.ndarray]:
    """(c) Fit on one GPU's rows only; every other GPU's rows (the power-capped H100
    rows included) are predicted from the shared parameters and their spec sheet."""
    med = _clean(medians)
    on = med["hardware"].map(gpu_of_hardware) == train_gpu
    return np.sort(med["config_id"][on].to_numpy()), np.sort(med["config_id"][~on].to_numpy())


def _spec_scaled_baseline(train_rows: pd.DataFrame, query: pd.DataFrame) -> pd.DataFrame:
    """Baseline for split (c): the training GPU's interpolation table for the same
    (model, TP), prompt time scaled by the FLOP/s ratio and token time by the HBM
    bandwidth ratio of the two spec sheets (SplitwiseSim itself cannot predict a GPU it
    has no profile of). No power-cap model."""
    out = pd.DataFrame(index=query.index, columns=["prompt_time", "token_time"], dtype=float)
    for (model, hardware, tp), q in query.groupby(list(SERIES_KEYS), sort=False):
        gpu = get_machine(MACHINE_OF_HARDWARE[hardware]).gpu
        src = train_rows[(train_rows["model"] == model) & (train_rows["tensor_parallel"] == tp)]
        if src.empty:
            continue
        src_hw = src["hardware"].iloc[0]
        src_gpu = get_machine(MACHINE_OF_HARDWARE[src_hw]).gpu
        pred = _safe_interp(src, q.assign(hardware=src_hw))
        out.loc[q.index, "prompt_time"] = pred["prompt_time"] * float(src_gpu.peak_flops_per_s / gpu.peak_flops_per_s)
        out.loc[q.index, "token_time"] = pred["token_time"] * float(src_gpu.hbm_bw_bytes_per_s / gpu.hbm_bw_bytes_per_s)
    return out


def _safe_interp(train_rows: pd.DataFrame, query: pd.DataFrame) -> pd.DataFrame:
    """`sim_table.interp_baseline_predict`, series by series; NaN where a series has
    fewer than two training knots."""
    from splitwise_jax.phases.sim_table import interp_baseline_predict

    out = pd.DataFrame(index=query.index, columns=["prompt_time", "token_time"], dtype=float)
    for _, q in query.groupby(list(SERIES_KEYS), sort=False):
        try:
            out.loc[q.index] = interp_baseline_predict(train_rows, q)[["prompt_time", "token_time"]].to_numpy()
        except ValueError:
            pass
    return out


def evaluate_split(rows: pd.DataFrame, medians: pd.DataFrame, split: str, seeds: Sequence[int] = (0,), *,
                   config: FitConfig = FitConfig(), progress: bool = True,
                   interval_level: float | None = 0.9) -> pd.DataFrame:
    """Fit on a split's training configurations and predict its held-out ones.

    Args:
        rows: the profile rows (`profiles.load_profiles`), for the baseline, which
            builds its knots from rows as SplitwiseSim does.
        medians: `profiles.profile_medians(rows)`.
        split: one of `SPLITS`.
        seeds: seeds of the random split (the other splits are deterministic and run once).
        config: fit options.
        progress: tqdm bars.
        interval_level: also give each held-out prediction its interval at this level
            (a Laplace step on each training fit, `laplace.py`; None: no intervals).

    Returns:
        One row per (seed, held-out configuration): CONFIG_KEYS, config_id, split, seed,
        measured prompt_time / token_time (ms, medians), the model's (`model_*`) and the
        baseline's (`base_*`) predictions; with intervals also interval_level and
        model_{prompt,token}_{lo,hi} (ms).

    Raises:
        ValueError: unknown split, or a split with nothing to train or test on.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    runs = [(s, *split_random(medians, s)) for s in seeds] if split == "random" else \
        [(0, *(split_extrapolation(medians) if split == "extrapolation" else split_spec_transfer(medians)))]
    frames = []
    for seed, train_ids, test_ids in runs:
        if len(train_ids) == 0 or len(test_ids) == 0:
            raise ValueError(f"split {split!r} leaves {len(train_ids)} training and {len(test_ids)} test "
                             "configurations in these profiles")
        fitted, _ = fit(medians, config=config, train_ids=train_ids, progress=progress,
                        desc=f"{split} seed {seed}" if split == "random" else split)
        test = medians[medians["config_id"].isin(set(test_ids))]
        pred = predict_frame(fitted, test)
        train_rows = rows[rows["config_id"].isin(set(train_ids))]
        base = _spec_scaled_baseline(train_rows, test) if split == "spec_transfer" else _safe_interp(train_rows, test)
        frame = test[list(CONFIG_KEYS) + ["config_id", "batch_tokens", "prompt_time", "token_time"]].assign(
            split=split, seed=seed,
            model_prompt_time=pred["prompt_time"].to_numpy(), model_token_time=pred["token_time"].to_numpy(),
            base_prompt_time=base["prompt_time"].to_numpy(), base_token_time=base["token_time"].to_numpy())
        if interval_level is not None:
            fitted = dataclasses.replace(fitted, uncertainty=laplace(fitted, medians, config=config,
                                                                     train_ids=train_ids))
            iv = predict_intervals(fitted, test, interval_level)
            frame = frame.assign(interval_level=interval_level, **{
                f"model_{ph}_{end}": iv[f"{ph}_time_{end}"].to_numpy() for ph in ("prompt", "token")
                for end in ("lo", "hi")})
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)

