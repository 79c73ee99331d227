"""Phase latency and power: prompt (prefill), token (decode) and mixed iterations.

One model covers all three. An iteration's time at full clock joins the GPU's streaming
work with its fixed, latency-bound work (kernel launches, small kernels, scheduler and
bookkeeping), which overlap:

    t = overlap_p( t_gpu, t_fixed )
    t_gpu     = roofline_p( t_compute, t_memory ) + t_comm

    t_compute = FLOPs / (tp x peak x eff(new tokens))
    FLOPs     = 2 N_params x new_tokens + [2 L d sum(s^2) (causal prompt attention)
                + 4 L d sum(c) (decode attention over contexts c)] / attn_eff
    eff(n)    = mfu_max x n / (n + n_half) / (1 + (n / knee)^knee_exp)
    t_memory  = weights_per_gpu / (bw x bw_eff) + KV_read_per_gpu / (bw x kv_bw_eff)
                + KV_written_per_gpu / (bw x bw_eff)
    t_comm    = 2 L [2 (tp-1) allreduce_latency                              (latency)
                     + 2 (tp-1)/tp x new_tokens x d x 2 B x slow(new tokens)
                       / (nvlink x link_eff)]                                 (transfer)
    slow(n)   = 1 + comm_knee_slowdown x h / (1 + h),  h = (n / comm_knee_tokens)^comm_knee_exp
    t_fixed   = [t_iter + L t_layer + prompts x t_prompt_seq + decodes x t_decode_seq
                 + decode context tokens x t_ctx_token] x (2,039 GB/s / bw)^fixed_bw_exponent

Models beyond the paper's dense fp16 pair (docs/model.md, "Precision, MoE and MLA"):

* Precision: weights and KV cache each have their own bytes per element
  (`LLM.weight_dtype`, `LLM.kv_dtype`); fp8 weights run on fp8 tensor cores, `peak` =
  `GPU.peak_fp8_flops_per_s`. The efficiencies (mfu_max, bw_eff, ...) are the fp16 fits.
* MoE: FLOPs count active parameters only; the routed experts run at the GEMM
  efficiency of the rows each expert sees, eff(k B / E_touched(B)). Weight traffic is
  the resident weights plus the E_touched(B) = E (1 - (1 - k/E)^B) experts per MoE
  layer that B tokens touch (`memory.streamed_weight_bytes_per_gpu`).
* MLA: KV bytes from the cached latent, replicated on every GPU under TP; attention
  FLOPs per (query, key) pair from its head widths (`LLM.attn_*_flops_coef`).

`overlap_p(a, b) = (a^p + b^p)^(1/p)` with p = `overlap_p` >= 1: p = 1 is strictly serial
(the sum), large p full overlap (the max). Why this form, from the profiles (SplitwiseSim
``perf_model.csv``; docs/calibration.md has the numbers):

* Llama2-70B decode takes the same time at TP4 and TP8 on both GPUs although the
  weights each GPU streams halve: a fixed floor hides the streaming work, so the two
  cannot simply add. TP2, whose streaming work is as long as the floor, is ~20% slower.
* The context-length slope of decode time is ~0.45 us per context token on A100 for
  both models and every TP, although BLOOM's KV cache per token is 12x Llama's: a fixed
  cost per context token (`t_ctx_token_s`), not KV bandwidth.
* The step in prompt time per token between 2,048 and 4,096 batch tokens grows with TP
  (~1.0x at TP2, ~1.15x at TP4, ~1.3-1.4x at TP8) as the share of all-reduce time does:
  the all-reduce transfer slows past `comm_knee_tokens` (bounded by
  1 + comm_knee_slowdown, so 16k-32k-token batches do not run away).
* A ring all-reduce takes 2 (tp-1) latency steps; with one latency per all-reduce,
  TP8 decode came out faster than TP4, which the data do not show.
* The fixed costs are GPU-side latency-bound work (they stretch with the clock under a
  power cap, below), so they also follow the GPU's generation: they are stated for an
  A100-80GB and scale with the HBM bandwidth on the spec sheet. fixed_bw_exponent = 1
  is the prior (a fit on A100 alone cannot see it); H100 decode floors are ~1.5x
  shorter than A100's in the profiles, bandwidth ratio 1.64.

A power cap lowers the clock f when the iteration's power demand exceeds it: compute,
fixed costs and communication stretch by 1/f, memory time by
(1/f)^mem_clock_sensitivity. The clock is the one at which the iteration's average power
meets the cap, with the energy above idle scaling as f^(dvfs_exponent - 1) (dynamic
energy per operation ~ V^2):

    P(f) = idle + (TDP - idle) (a_c t_compute + a_m t_memory + a_x t_transfer) f^(d-1) / t(f) = cap

with a_x = p_comm_frac on the all-reduce transfer time (latency steps are waiting and
draw nothing above idle), solved by Newton's method in log f (see `_capped_clock`).
Decode demand sits below a 70% cap on H100, so decode is unchanged while prompts slow
(Splitwise insight VII).

All functions take calibration parameters first and are pure: jit, vmap and grad them.

References:
    Roofline: Williams et al., CACM 2009. Transformer FLOPs: Kaplan et al. 2020,
    arXiv 2001.08361 (2N per token) plus attention. Ring all-reduce: Patarasuk & Yuan,
    JPDC 2009 (2 (p-1) steps). Splitwise §III (insights III-VII).
    docs/model.md lists every equation with units; docs/calibration.md the fit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.phases._caps import cap_floor_frac
from splitwise_jax._roots import newton_implicit
from splitwise_jax._smooth import safe_div, safe_pow, smooth_max_pos, smooth_min_one
from splitwise_jax._validate import check_positive, check_range, is_concrete
from splitwise_jax.specs.batch import Batch
from splitwise_jax.specs.hardware import GPU, Machine
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.memory import experts_touched, kv_bytes_per_token_stored, resolve_tp, streamed_weight_bytes_per_gpu
from splitwise_jax.phases.params import PhaseParams
from splitwise_jax.phases import power as _power

_ACT_BYTES = 2.0  # fp16 activations in all-reduce
# Fixed costs are given for a GPU with this HBM bandwidth (A100-80GB's 2,039 GB/s) and
# scale as (FIXED_COST_REF_BW / bw)^fixed_bw_exponent on others (see the module docstring).
FIXED_COST_REF_BW_BYTES_PER_S = 2.039e12

# Newton steps for the capped clock. Started from the closed form that assumes every
# time component stretches as 1/f, the residual is below 1e-9 after 3 steps and at
# round-off after 4 over caps from the floor to TDP (tests/test_phases.py checks it);
# unrolled steps keep jit/vmap/grad plain, and their derivative converges with them.
_CLOCK_NEWTON_STEPS = 4
# Temperature of the smooth min(f, 1): within 0.02 x log 2 ~ 1.4% of the hard min.
_CLOCK_TEMPERATURE = 0.02


def check_cap_frac(gpu: GPU, cap_frac) -> None:
    """Raise ValueError unless a concrete cap_frac lies in [min_cap_w / tdp_w, 1]."""
    if not (is_concrete(cap_frac) and is_concrete(gpu)):
        return
    # max: a GPU whose fields are arrays (rows of several GPUs) checks against the highest floor
    lo = float(np.max(np.asarray(cap_floor_frac(gpu), dtype=float)))
    check_range("cap_frac", cap_frac, lo, 1.0,
                unit=f"(fraction of {gpu.name}'s TDP {np.asarray(gpu.tdp_w, dtype=float).max():g} W; "
                     "floor = min_cap_w / tdp_w)")


def _time_at_clock(params: PhaseParams, compute, memory, comm, fixed, x):
    """Iteration time (s) at clock f = exp(x): GPU work and host work joined by overlap_p."""
    stretch = jnp.exp(-x)
    gpu_s = (smooth_max_pos(compute * stretch, memory * jnp.exp(-params.mem_clock_sensitivity * x),
                            params.roofline_p)
             + comm * stretch)
    return smooth_max_pos(gpu_s, fixed * stretch, params.overlap_p)


def allreduce_slowdown(params: PhaseParams, new_tokens):
    """Factor (>= 1, bounded by 1 + comm_knee_slowdown) on the all-reduce bandwidth time."""
    h = safe_pow(jnp.maximum(new_tokens, 0.0) / params.comm_knee_tokens, params.comm_knee_exp)
    return 1.0 + params.comm_knee_slowdown * h / (1.0 + h)


def _capped_clock(params: PhaseParams, gpu: GPU, compute, memory, comm, fixed, comm_transfer, cap_frac):
    """Clock fraction f at which the iteration's power meets the cap, and the latency at f.

    With t(f) = overlap_p(roofline_p(compute / f, memory / f^s) + comm / f, fixed / f) and
    energy above idle E(f) = (TDP - idle) (p_compute_frac compute + p_memory_frac memory
    + p_comm_frac comm_transfer) f^(d-1) (comm_transfer: the all-reduce's bandwidth part;
    its latency steps are waiting and draw nothing above idle), solve
    E(f) / t(f) = cap - idle for log f. P(f) rises with f, so the root is unique; and because E falls when bandwidth or FLOP/s rise, the capped latency
    (= E(f)/(cap-idle) when the cap binds) never rises with them. The earlier closed
    form, which took the full-clock power times f^d, ignored that memory time barely
    stretches and let latency rise with bandwidth by up to ~5% at the floor cap.

    Gradients use the implicit function theorem: the Newton iterations run on
    stop-gradient inputs and one last Newton step, with the slope held constant, carries
    dx = -dr / r'(x*) (exact at the root). Differentiating through the unrolled
    iterations instead gives the same first derivatives but a ~10x larger reverse-mode
    graph, which made the calibration's jit take minutes to compile.
    """

    def residual_fn(params, compute, memory, comm, fixed, comm_transfer, headroom):
        d = params.dvfs_exponent
        log_energy = jnp.log(params.p_compute_frac * compute + params.p_memory_frac * memory
                             + params.p_comm_frac * comm_transfer)

        def residual(x):  # log(power above idle at f / headroom); increasing in x
            return (log_energy + (d - 1.0) * x - jnp.log(_time_at_clock(params, compute, memory, comm, fixed, x))
                    - jnp.log(headroom))

        return residual

    headroom = jnp.maximum(cap_frac * gpu.tdp_w - gpu.idle_w, 1e-3) / (gpu.tdp_w - gpu.idle_w)
    args = (params, compute, memory, comm, fixed, comm_transfer, headroom)
    residual_sg = residual_fn(*jax.lax.stop_gradient(args))
    # start: exact if every component stretched as 1/f; the steps are a fori_loop
    # (nothing flows back through it): one Newton step compiled, not _CLOCK_NEWTON_STEPS
    x0 = -residual_sg(jnp.zeros_like(compute)) / jax.lax.stop_gradient(params.dvfs_exponent)
    x = newton_implicit(residual_fn(*args), residual_sg, x0, _CLOCK_NEWTON_STEPS)
    clock = smooth_min_one(jnp.exp(x), _CLOCK_TEMPERATURE)
    return clock, _time_at_clock(params, compute, memory, comm, fixed, jnp.log(clock))


class IterationBreakdown(NamedTuple):
    """Time components of one iteration at full clock (seconds) and its outcome."""

    compute_s: jnp.ndarray
    memory_s: jnp.ndarray
    comm_s: jnp.ndarray
    fixed_s: jnp.ndarray
    clock: jnp.ndarray
    latency_s: jnp.ndarray
    demand_w: jnp.ndarray
    power_w: jnp.ndarray
    comm_transfer_s: jnp.ndarray  # the bandwidth part of comm_s (draws power)


def gemm_efficiency(params: PhaseParams, new_tokens):
    """Fraction of peak FLOP/s reached with `new_tokens` rows in the GEMMs."""
    n = jnp.maximum(new_tokens, 1e-6)
    rise = n / (n + params.n_half_tokens)
    fall = 1.0 + safe_pow(n / params.knee_tokens, params.knee_exp)
    return params.mfu_max * rise / fall


def tokens_per_expert(llm: LLM, new_tokens):
    """Rows each touched routed expert's GEMM sees: k B / E_touched(B) (MoE models).

    Tends to k / (-E log(1 - k/E)) (~1) as B -> 0 and to k B / E for large batches.
    """
    k = float(llm.moe.experts_per_token)
    b = jnp.asarray(new_tokens, dtype=float)
    # double where: at B = 0 the ratio is 0/0, and the untaken branch's gradient would
    # still flow (NaN x 0); evaluate it at a safe B and take the limit there instead
    ok = b > 1e-6
    b_safe = jnp.where(ok, b, 1.0)
    e = float(llm.moe.n_experts)
    limit = k / (e * -np.log1p(-k / e)) if k < e else k / e
    return jnp.where(ok, k * b_safe / experts_touched(llm, b_safe), limit)


def _moe_compute_s(params: PhaseParams, llm: LLM, new, attn_flops, peak_flops_per_s):
    """Compute time of an MoE iteration (s): active parameters only.

    The resident weights (attention, dense and shared-expert MLPs, embeddings) and the
    attention run at the GEMM efficiency of all `new` tokens; the routed experts' 2 x
    (k experts' parameters) FLOPs per token run at the efficiency of the rows each
    touched expert sees (`tokens_per_expert`), which is what makes small MoE batches
    inefficient.
    """
    m = llm.moe
    routed_active = float(m.n_moe_layers * m.experts_per_token * llm.expert_params)
    resident = llm.n_params - llm.routed_expert_params
    return (safe_div(2.0 * resident * new + attn_flops, peak_flops_per_s * gemm_efficiency(params, new))
            + safe_div(2.0 * routed_active * new,
                       peak_flops_per_s * gemm_efficiency(params, tokens_per_expert(llm, new))))


def iteration(params: PhaseParams, machine: Machine, llm: LLM, batch: Batch, *, tp: int | None = None,
              cap_frac=1.0) -> IterationBreakdown:
    """Latency and power of one iteration of a model instance.

    Args:
        params: calibration parameters.
        machine: the machine (its GPUs run one instance at tensor parallel `tp`).
        llm: the model.
        batch: what the iteration processes.
        tp: tensor-parallel degree (static int); default all GPUs of the machine.
        cap_frac: power cap as a fraction of TDP, in [min_cap/TDP, 1].

    Returns:
        IterationBreakdown; `latency_s` is the iteration time (s), `power_w` the
        per-GPU draw (W).

    Raises:
        ValueError: (concrete values only) a negative or NaN batch field, `cap_frac`
            outside [min_cap_w / tdp_w, 1], or `tp` outside [1, gpus_per_machine].
    """
    tp = resolve_tp(machine, tp)
    gpu = machine.gpu
    check_cap_frac(gpu, cap_frac)
    compute, memory, comm, fixed, comm_transfer = _components(params, machine, llm, batch, tp)
    full_clock = _time_at_clock(params, compute, memory, comm, fixed, 0.0)
    u_compute = compute / full_clock
    u_memory = memory / full_clock
    # all-reduce transfers draw power too (reduction kernels, NVLink): p_comm_frac of TDP - idle
    demand = (_power.power_demand_w(params, gpu, u_compute, u_memory)
              + (gpu.tdp_w - gpu.idle_w) * params.p_comm_frac * comm_transfer / full_clock)
    clock, latency = _capped_clock(params, gpu, compute, memory, comm, fixed, comm_transfer, cap_frac)
    power = _power.capped_power_w(gpu, demand, cap_frac)
    return IterationBreakdown(compute, memory, comm, fixed, clock, latency, demand, power, comm_transfer)


def iteration_time_s(params: PhaseParams, machine: Machine, llm: LLM, batch: Batch, *, tp: int | None = None):
    """Iteration time at full clock (s): `iteration(...).latency_s` without a power cap.

    The same time components joined the same way, without the capped-clock solve and the
    power terms (an uncapped GPU runs at full clock: the capped solve returns f = 1 up to
    its smooth min's temperature). For models that never cap the GPU and evaluate many
    iterations (the serving engine's fixed points), at a fraction of the cost.
    """
    tp = resolve_tp(machine, tp)
    return _time_at_clock(params, *_components(params, machine, llm, batch, tp)[:4], 0.0)


def _components(params: PhaseParams, machine: Machine, llm: LLM, batch: Batch, tp: int):
    """(compute, memory, comm, fixed, comm_transfer) times of one iteration at full clock (s)."""
    gpu = machine.gpu
    for f in ("prompt_tokens", "prompt_seqs", "prompt_sq_tokens", "decode_seqs", "decode_ctx_tokens"):
        check_positive(f"batch.{f}", getattr(batch, f), allow_zero=True, unit="(count)")
    L, d = llm.n_layers, llm.d_model
    new = batch.new_tokens
    peak = gpu.peak_flops_for(llm.fp8_compute)
    # attention runs at attn_eff of the GEMMs' efficiency (softmax, masking, s^2 scores);
    # the coefficients are exact integers, so for the paper's models this is bit for bit
    # the former 2 L d sum(s^2) + 4 L d sum(c)
    attn = (float(llm.attn_prompt_flops_coef) * jnp.asarray(batch.prompt_sq_tokens)
            + float(llm.attn_decode_flops_coef) * jnp.asarray(batch.decode_ctx_tokens)) / params.attn_eff
    if llm.moe is None:
        compute = safe_div(2.0 * llm.n_params * new + attn, tp * peak * gemm_efficiency(params, new))
    else:
        compute = _moe_compute_s(params, llm, new, attn, tp * peak)

    kv_tok = kv_bytes_per_token_stored(llm, tp)
    bw = gpu.hbm_bw_bytes_per_s
    memory = (streamed_weight_bytes_per_gpu(llm, tp, new) / (bw * params.bw_eff)
              + jnp.asarray(batch.decode_ctx_tokens) * kv_tok / tp / (bw * params.kv_bw_eff)
              + new * kv_tok / tp / (bw * params.bw_eff))

    ring = 2.0 * (tp - 1) / tp
    if tp > 1:
        comm_latency = 2.0 * L * 2.0 * (tp - 1) * params.allreduce_latency_s * jnp.ones_like(new)
        comm_transfer = (2.0 * L * ring * new * d * _ACT_BYTES * allreduce_slowdown(params, new)
                         / (machine.nvlink_bytes_per_s * params.link_eff))
    else:
        comm_latency = comm_transfer = jnp.zeros_like(new)
    comm = comm_latency + comm_transfer
    fixed = ((params.t_iter_s + L * params.t_layer_s
              + jnp.asarray(batch.prompt_seqs) * params.t_prompt_seq_s
              + jnp.asarray(batch.decode_seqs) * params.t_decode_seq_s
              + jnp.asarray(batch.decode_ctx_tokens) * params.t_ctx_token_s)
             * safe_pow(FIXED_COST_REF_BW_BYTES_PER_S / bw, params.fixed_bw_exponent))
    return compute, memory, comm, fixed, comm_transfer


def prompt_latency_s(params: PhaseParams, machine: Machine, llm: LLM, prompt_size, batch_size=1.0, *,
                     tp: int | None = None, cap_frac=1.0):
    """Time of one prompt iteration over `batch_size` prompts of `prompt_size` tokens (s)."""
    check_positive("prompt_size", prompt_size, unit="tokens")
    check_positive("batch_size", batch_size, unit="prompts")
    return iteration(params, machine, llm, Batch.prompts(prompt_size, batch_size), tp=tp,
                     cap_frac=cap_frac).latency_s


def token_latency_s(params: PhaseParams, machine: Machine, llm: LLM, batch_size, context_tokens, *,
                    tp: int | None = None, cap_frac=1.0):
    """Time of one decode iteration of `batch_size` sequences at mean context `context_tokens` (s)."""
    check_positive("batch_size", batch_size, unit="sequences")
    check_positive("context_tokens", context_tokens, unit="tokens")
    return iteration(params, machine, llm, Batch.decode(batch_size, context_tokens), tp=tp,
                     cap_frac=cap_frac).latency_s


def mean_token_latency_s(params: PhaseParams, machine: Machine, llm: LLM, prompt_size, batch_size,
                         token_size, *, tp: int | None = None, cap_frac=1.0):
    """Mean decode-iteration time while generating `token_size` tokens after a prompt (s).

    This is the profiles' `token_time`: the batch's context grows from prompt_size to
    prompt_size + token_size; decode time is affine in context, so the mean equals the
    time at the mean context prompt_size + token_size / 2.
    """
    check_positive("prompt_size", prompt_size, unit="tokens")
    check_positive("token_size", token_size, allow_zero=True, unit="tokens")
    ctx = jnp.asarray(prompt_size, dtype=float) + 0.5 * jnp.asarray(token_size, dtype=float)
    return token_latency_s(params, machine, llm, batch_size, ctx, tp=tp, cap_frac=cap_frac)


def mixed_latency_s(params: PhaseParams, machine: Machine, llm: LLM, prompt_tokens, prompt_seqs,
                    prompt_sq_tokens, decode_seqs, decode_ctx_tokens, *, tp: int | None = None, cap_frac=1.0):
    """Time of one iteration that batches prompts and decode tokens together (s)."""
    for name, v in (("prompt_tokens", prompt_tokens), ("prompt_seqs", prompt_seqs),
                    ("prompt_sq_tokens", prompt_sq_tokens), ("decode_seqs", decode_seqs),
                    ("decode_ctx_tokens", decode_ctx_tokens)):
        check_positive(name, v, allow_zero=True, unit="(count)")
    batch = Batch(prompt_tokens, prompt_seqs, prompt_sq_tokens, decode_seqs, decode_ctx_tokens)
    return iteration(params, machine, llm, batch, tp=tp, cap_frac=cap_frac).latency_s


def iteration_power_w(params: PhaseParams, machine: Machine, llm: LLM, batch: Batch, *, tp: int | None = None,
                      cap_frac=1.0):
    """Per-GPU power draw during an iteration (W)."""
    return iteration(params, machine, llm, batch, tp=tp, cap_frac=cap_frac).power_w
