"""splitwise_jax: a differentiable analytical model of Splitwise LLM inference clusters.

Phase latency, memory and power are smooth JAX functions of GPU specs and batch
composition (`phases`, `memory`, `power`, `kv_transfer`), calibrated by gradient fit to
measured A100/H100 profiles (`calibrate`); they compose into a vectorised fluid/queueing
model of split clusters (`evaluate`), optimised by gradient (`optimize`).

References:
    P. Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
    Splitting", ISCA 2024, arXiv 2311.18677.
"""

# Every public name loads on first use (PEP 562, `__getattr__` below): `import
# splitwise_jax` imports neither JAX (~0.5 s) nor pandas, so a command line that does
# not need them (a warm `python -m splitwise_jax.simulate`, docs/speed.md §10) starts in
# the time of NumPy's import. `sj.evaluate` is `cluster.batched.evaluate`: `evaluate`
# with a batching rule (`jax.vmap` of it maps one configuration at a time on CPU, as
# `sweep` does); `uniform_names` gives one compiled program for every design of a
# strategy (names are static pytree metadata); `load_profiles` and `profile_medians` are
# the measured profiles the phase model is calibrated on; `load_workload` is the
# preset/trace loader (`splitwise_jax.cluster.workload.workload`: the name `workload`
# stays the module).
_MODEL_NAMES = {
    "Batch": ("splitwise_jax.specs.batch", "Batch"),
    "get_gpu": ("splitwise_jax.specs.catalog", "get_gpu"),
    "get_llm": ("splitwise_jax.specs.catalog", "get_llm"),
    "get_machine": ("splitwise_jax.specs.catalog", "get_machine"),
    "load_specs": ("splitwise_jax.specs.catalog", "load_specs"),
    "llm_names": ("splitwise_jax.specs.catalog", "llm_names"),
    "machine_names": ("splitwise_jax.specs.catalog", "machine_names"),
    "Cluster": ("splitwise_jax.cluster.cluster", "Cluster"),
    "ClusterMetrics": ("splitwise_jax.cluster.cluster", "ClusterMetrics"),
    "Resolution": ("splitwise_jax.cluster.cluster", "Resolution"),
    "SWEEP_RESOLUTION": ("splitwise_jax.cluster.cluster", "SWEEP_RESOLUTION"),
    "Scheduling": ("splitwise_jax.cluster.cluster", "Scheduling"),
    "Transfer": ("splitwise_jax.cluster.cluster", "Transfer"),
    "evaluate": ("splitwise_jax.cluster.batched", "evaluate"),
    "Status": ("splitwise_jax.cluster.metrics", "Status"),
    "STRATEGIES": ("splitwise_jax.cluster.strategies", "STRATEGIES"),
    "ChunkedScheduling": ("splitwise_jax.cluster.chunked", "ChunkedScheduling"),
    "DESIGNS": ("splitwise_jax.cluster.designs", "DESIGNS"),
    "PRESETS": ("splitwise_jax.cluster.designs", "PRESETS"),
    "Design": ("splitwise_jax.cluster.designs", "Design"),
    "Pool": ("splitwise_jax.cluster.designs", "Pool"),
    "build_cluster": ("splitwise_jax.cluster.designs", "build_cluster"),
    "make_cluster": ("splitwise_jax.cluster.designs", "make_cluster"),
    "make_timing": ("splitwise_jax.cluster.designs", "make_timing"),
    "PHASE_MODELS": ("splitwise_jax.cluster.designs", "PHASE_MODELS"),
    "uniform_names": ("splitwise_jax.cluster.designs", "uniform_names"),
    "GPU": ("splitwise_jax.specs.hardware", "GPU"),
    "Machine": ("splitwise_jax.specs.hardware", "Machine"),
    "LLM": ("splitwise_jax.specs.llm", "LLM"),
    "PAPER_SLO": ("splitwise_jax.specs.paper", "PAPER_SLO"),
    "PhaseParams": ("splitwise_jax.phases.params", "PhaseParams"),
    "default_params": ("splitwise_jax.phases.params", "default_params"),
    "mean_token_latency_s": ("splitwise_jax.phases.phases", "mean_token_latency_s"),
    "mixed_latency_s": ("splitwise_jax.phases.phases", "mixed_latency_s"),
    "prompt_latency_s": ("splitwise_jax.phases.phases", "prompt_latency_s"),
    "token_latency_s": ("splitwise_jax.phases.phases", "token_latency_s"),
    "layerwise_transfer_s": ("splitwise_jax.phases.kv_transfer", "layerwise_transfer_s"),
    "serialized_transfer_s": ("splitwise_jax.phases.kv_transfer", "serialized_transfer_s"),
    "fits": ("splitwise_jax.phases.memory", "fits"),
    "provisioned_power_w": ("splitwise_jax.phases.power", "provisioned_power_w"),
    "load_profiles": ("splitwise_jax.phases.profiles", "load_profiles"),
    "profile_medians": ("splitwise_jax.phases.profiles", "profile_medians"),
    "Workload": ("splitwise_jax.cluster.workload", "Workload"),
    "coarsen": ("splitwise_jax.cluster.workload", "coarsen"),
    "load_trace": ("splitwise_jax.cluster.workload", "load_trace"),
    "load_workload": ("splitwise_jax.cluster.workload", "workload"),
}

__version__ = "0.1.0"


# --------------------------------------------------------------------------------------
# Public functions that share their name with a command-line module.
#
# `splitwise_jax.evaluate` is both the model function (`sj.evaluate`, the quick start)
# and the module behind `python -m splitwise_jax.evaluate`. After importing a submodule,
# the import system binds it on its parent (`setattr(package, "evaluate", module)`),
# which would silently replace the function for every later `sj.evaluate(...)` in the
# program. The package's module class refuses that one rebinding: a name in
# `_PROTECTED` keeps its function when a same-named submodule is imported. The submodule
# itself stays importable (`from splitwise_jax.evaluate import main` and
# `python -m splitwise_jax.evaluate` read it from `sys.modules`).

import sys as _sys  # noqa: E402
import types as _types  # noqa: E402

#: Public API functions that a same-named submodule (a CLI) must not replace.
_PROTECTED = frozenset({"evaluate", "simulate"})


# The simulator's names load on first use (PEP 562): `splitwise_jax.simulate` and the
# pandas it reads traces with (0.2-0.3 s) are not imported by `import splitwise_jax`, so
# the model's command lines (`evaluate`, `optimize`) do not pay for them at start.
_LAZY = {
    **_MODEL_NAMES,
    "SimResult": ("splitwise_jax.simulate.api", "SimResult"),
    "simulate": ("splitwise_jax.simulate.api", "simulate"),
    "SimConfig": ("splitwise_jax.simulate.policies", "SimConfig"),
    "RequestTrace": ("splitwise_jax.simulate.trace", "RequestTrace"),
    "trace_from_csv": ("splitwise_jax.simulate.trace", "from_csv"),
    "poisson_trace": ("splitwise_jax.simulate.trace", "poisson"),
    # the serving engine (docs/serving.md): a benchmark table's rows -> predictions, the fit
    "EngineParams": ("splitwise_jax.cluster.engine", "EngineParams"),
    "EngineStage": ("splitwise_jax.cluster.engine", "Stage"),
    "engine_stage_metrics": ("splitwise_jax.cluster.engine", "stage_metrics"),
    "read_benchmarks": ("splitwise_jax.io.benchmarks", "read_benchmarks"),
    "load_stack": ("splitwise_jax.io.benchmark_rows", "load_stack"),
    "predict_benchmarks": ("splitwise_jax.io.benchmark_rows", "predict_frame"),
    "fit_benchmarks": ("splitwise_jax.calibrate.benchmarks", "fit_benchmarks"),
    "leave_one_model_out": ("splitwise_jax.calibrate.benchmarks", "leave_one_model_out"),
    "simulate_engine": ("splitwise_jax.simulate.serving_engine", "simulate_experiment"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        _sys.modules[__name__].__dict__[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(_types.ModuleType):
    """The package's module type: keeps `_PROTECTED` functions bound on import."""

    def __setattr__(self, name, value):
        current = self.__dict__.get(name)
        function_bound = callable(current) and not isinstance(current, _types.ModuleType)
        if name in _PROTECTED and isinstance(value, _types.ModuleType) and (function_bound or name in _LAZY):
            return  # the import system binding the CLI submodule: keep the function (or its lazy load)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
