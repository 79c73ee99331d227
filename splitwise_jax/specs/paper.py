"""The Splitwise paper's reported numbers, in one place, each with its source.

Everything the package and the studies compare with ("paper vs ours") is read from
here: the SLO limits of Table VI, the Fig. 12 provisioning answer, the headline ratios
of Figs. 18-19, and the figures of Figs. 14-17 and 20. Nothing here is a model
parameter; changing a number here changes what we compare with, never a prediction
(except `TABLE_VI_SLO`, the default SLO of `evaluate` and `optimize`).

References:
    P. Patel, E. Choukse, C. Zhang, A. Shah, I. Goiri, S. Maleki, R. Bianchini,
    "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024,
    arXiv 2311.18677. Section, figure and table numbers below are that paper's.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------
# SLOs (Table VI): slowdown limits against the request running alone on one DGX-A100.

#: Rows TTFT, TBT, E2E; columns P50, P90, P99 (Table VI). A design meets its SLO only
#: if all nine hold (§VI-A).
TABLE_VI_SLO: tuple[tuple[float, float, float], ...] = ((2.0, 3.0, 6.0), (1.25, 1.5, 5.0), (1.25, 1.5, 5.0))
#: The name the package has always exported (`splitwise_jax.PAPER_SLO`).
PAPER_SLO = TABLE_VI_SLO

# --------------------------------------------------------------------------------------
# Provisioning (§VI-A, Fig. 12)

#: Fig. 12: Splitwise-HH on the coding trace at 70 req/s; the cheapest design meeting
#: every SLO, found by a 2-D grid search with the simulator.
FIG12 = dict(design="splitwise-hh", workload="coding", rate_per_s=70.0, prompt_machines=27, token_machines=3)

# --------------------------------------------------------------------------------------
# Iso-power / iso-cost / iso-throughput designs (§VI-C, Figs. 18-19)

#: The iso-power and iso-cost budgets are those of 40 DGX-H100 (§VI-C: "40 DGX-H100
#: ~ 70 DGX-A100" in provisioned power).
ISO_REFERENCE_MACHINES = 40
ISO_REFERENCE_MACHINE = "dgx-h100"

#: Headline ratios of Figs. 18-19: `problem` is the sizing problem ("iso-power",
#: "iso-cost": throughput-optimised under that budget; "cost", "power": cost- or
#: power-optimised at the iso-throughput load), `metric` is compared between `design`
#: and `reference` (ratio design / reference). HA's 1.18x and -10% are read against
#: Baseline-H100: at equal provisioned power an H100+A100 cluster cannot cost less than
#: an all-A100 one (A100: $0.71 per provisioned power unit, H100: $0.87), so "10% lower
#: cost" only makes sense against Baseline-H100.
HEADLINES: tuple[dict, ...] = (
    dict(problem="iso-power", design="splitwise-aa", reference="baseline-a100", metric="throughput", paper=2.15,
         text="Fig. 18 iso-power: Splitwise-AA throughput / Baseline-A100"),
    dict(problem="iso-power", design="splitwise-aa", reference="baseline-a100", metric="cost", paper=1.0,
         text="Fig. 18 iso-power: Splitwise-AA cost / Baseline-A100 (paper: same cost)"),
    dict(problem="iso-power", design="splitwise-ha", reference="baseline-h100", metric="throughput", paper=1.18,
         text="Fig. 18 iso-power: Splitwise-HA throughput / Baseline-H100"),
    dict(problem="iso-power", design="splitwise-ha", reference="baseline-h100", metric="cost", paper=0.90,
         text="Fig. 18 iso-power: Splitwise-HA cost / Baseline-H100"),
    dict(problem="iso-cost", design="splitwise-aa", reference="baseline-h100", metric="throughput", paper=1.4,
         text="Fig. 18 iso-cost: Splitwise-AA throughput / Baseline-H100"),
    dict(problem="iso-cost", design="splitwise-aa", reference="baseline-h100", metric="power", paper=1.25,
         text="Fig. 18 iso-cost: Splitwise-AA power / Baseline-H100"),
    dict(problem="iso-cost", design="splitwise-aa", reference="baseline-h100", metric="machines", paper=2.0,
         text="Fig. 18 iso-cost: Splitwise-AA machines (floor space) / Baseline-H100"),
    dict(problem="power", design="splitwise-hhcap", reference="baseline-h100", metric="power", paper=0.75,
         text="Fig. 19 iso-throughput, power-optimised: Splitwise-HHcap power / Baseline-H100"),
    dict(problem="cost", design="splitwise-aa", reference="baseline-h100", metric="cost", paper=0.75,
         text="Fig. 19 iso-throughput, cost-optimised: Splitwise-AA cost / Baseline-H100"),
)

#: Without latency SLOs (batch jobs) Splitwise converges to the mixed pool (§VI-C):
#: throughput per dollar of Splitwise-AA equals Baseline-A100's (0.89 req/s/$) and
#: Splitwise-HH equals Baseline-H100's (0.75 req/s/$). (design, reference) -> ratio.
NO_SLO_PER_DOLLAR = {("splitwise-aa", "baseline-a100"): 1.0, ("splitwise-hh", "baseline-h100"): 1.0}
NO_SLO_RPS_PER_DOLLAR = {"baseline-a100": 0.89, "baseline-h100": 0.75}

# --------------------------------------------------------------------------------------
# KV-cache transfer (§V-C, Figs. 14-15)

#: Fig. 14: visible layer-wise transfer overhead, ms, by link.
FIG14_LAYERWISE_MS = {"A100->A100": 8.0, "H100->H100": 5.0}
#: Fig. 14: layer-wise overhead stays below this fraction of the prompt time.
FIG14_LAYERWISE_MAX_FRAC = 0.07
#: Fig. 15 (coding): E2E overhead of the transfer, by mode (fraction; "up to 3%").
FIG15_E2E_OVERHEAD = {"serialized": 0.03, "layerwise": 0.008}
#: Fig. 15 (Splitwise-HH): second-token latency increase, by mode (fraction).
FIG15_SECOND_TOKEN_INCREASE = {"serialized": 0.64, "layerwise": 0.165}

# --------------------------------------------------------------------------------------
# Latency and batching under load (§VI-B, Figs. 16-17; §III insight II)

#: Fig. 16: HA's mixed pool takes over from this load on coding (req/s).
FIG16_HA_MIXED_RATE = 90.0
#: Fig. 17: at 70 req/s of coding, Baseline-H100 machines spend this share of their
#: time with <= 15 active tokens.
FIG17_SHARE_LE15_TOKENS = 0.70
#: Insight II: with mixed continuous batching, conversation spends 60-70% of its time
#: with <= 20 active tokens (the middle of that range).
INSIGHT2_SHARE_LE20_TOKENS = 0.65

# --------------------------------------------------------------------------------------
# Robustness (§VI-D, Fig. 20)

#: Fig. 20: throughput lost by a cluster sized for coding running conversation.
FIG20_LOSS = {"splitwise-aa": 0.0, "splitwise-hh": 0.0, "splitwise-ha": 0.07, "splitwise-hhcap": 0.07}
