"""Error tables of held-out predictions: MAPE and max |error|, model vs baseline.

Error = |predicted / measured median - 1|, in percent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from splitwise_jax.calibrate.splits import SPLIT_LABELS, SPLITS

def _errors(predictions: pd.DataFrame) -> pd.DataFrame:
    df = predictions.copy()
    for who in ("model", "base"):
        for ph in ("prompt", "token"):
            df[f"{who}_{ph}_err"] = 100.0 * (df[f"{who}_{ph}_time"] / df[f"{ph}_time"] - 1.0).abs()
    return df


def _agg(g: pd.DataFrame) -> pd.Series:
    out = {"n": len(g)}
    for who in ("model", "base"):
        for ph in ("prompt", "token"):
            e = g[f"{who}_{ph}_err"]
            out[f"{who}_{ph}_mape"] = e.mean() if e.notna().any() else np.nan
            out[f"{who}_{ph}_max"] = e.max() if e.notna().any() else np.nan
    return pd.Series(out)


def error_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """MAPE and max |error| (%) per split and (model, hardware, TP), model vs baseline.

    Args:
        predictions: rows of `evaluate_split` (several splits concatenated is fine).

    Returns:
        Columns split, model, hardware, tensor_parallel, n (held-out predictions scored,
        all seeds pooled), then {model,base}_{prompt,token}_{mape,max} in percent (NaN
        where the baseline has no prediction). Error = |predicted / measured median - 1|.
    """
    df = _errors(predictions)
    by = ["split", "model", "hardware", "tensor_parallel"]
    table = df.groupby(by, sort=False).apply(_agg, include_groups=False).reset_index()
    table["n"] = table["n"].astype(int)
    return table


def summary_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """Per split: all held-out predictions; TP 4 and 8 only; and each hardware kind.

    Returns:
        Columns split, subset, n and the error columns of `error_table`.
    """
    df = _errors(predictions)
    rows = []
    for split, g in df.groupby("split", sort=False):
        subsets = [("all", g), ("TP 4 and 8", g[g["tensor_parallel"] >= 4])]
        subsets += [(f"hardware {h}", gh) for h, gh in g.groupby("hardware", sort=True)]
        for name, sub in subsets:
            if len(sub):
                rows.append({"split": split, "subset": name, **_agg(sub).to_dict()})
    out = pd.DataFrame(rows)
    out["n"] = out["n"].astype(int)
    return out



def _fmt(model: float, base: float) -> str:
    b = "-" if not np.isfinite(base) else f"{base:.1f}"
    return f"{model:.1f} / {b}"


def markdown_tables(predictions: pd.DataFrame) -> str:
    """The error tables as markdown: per split, a summary and the per-series table.

    Each cell reads "model / baseline" in percent.
    """
    summ = summary_table(predictions)
    detail = error_table(predictions)
    lines = []
    for split in [s for s in SPLITS if s in set(predictions["split"])]:
        seeds = sorted(set(predictions.loc[predictions["split"] == split, "seed"]))
        lines += [f"### {SPLIT_LABELS[split]}", ""]
        if split == "random":
            lines += [f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} random splits), all held-out predictions "
                      "pooled.", ""]
        head = ("| {} | n | prompt MAPE | prompt max | token MAPE | token max |\n"
                "|---|---:|---:|---:|---:|---:|")
        lines.append(head.format("subset"))
        for _, r in summ[summ["split"] == split].iterrows():
            lines.append(f"| {r['subset']} | {r['n']} | {_fmt(r['model_prompt_mape'], r['base_prompt_mape'])} | "
                         f"{_fmt(r['model_prompt_max'], r['base_prompt_max'])} | "
                         f"{_fmt(r['model_token_mape'], r['base_token_mape'])} | "
                         f"{_fmt(r['model_token_max'], r['base_token_max'])} |")
        lines.append("")
        lines.append(head.format("model, hardware, TP"))
        for _, r in detail[detail["split"] == split].iterrows():
            lines.append(f"| {r['model']}, {r['hardware']}, {r['tensor_parallel']} | {r['n']} | "
                         f"{_fmt(r['model_prompt_mape'], r['base_prompt_mape'])} | "
                         f"{_fmt(r['model_prompt_max'], r['base_prompt_max'])} | "
                         f"{_fmt(r['model_token_mape'], r['base_token_mape'])} | "
                         f"{_fmt(r['model_token_max'], r['base_token_max'])} |")
        lines.append("")
    return "\n".join(lines)


def coverage_markdown(table: pd.DataFrame) -> str:
    """The coverage table as markdown (one row per split and phase)."""
    lines = ["| split | phase | level | n | covered |", "|---|---|---:|---:|---:|"]
    for _, r in table.iterrows():
        lines.append(f"| {SPLIT_LABELS.get(r['split'], r['split'])} | {r['phase']} | {r['level']:.0%} | {r['n']} | "
                     f"{r['covered']:.1%} |")
    return "\n".join(lines)
