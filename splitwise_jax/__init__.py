"""splitwise_jax: a differentiable analytical model of Splitwise LLM inference clusters.

Phase latency, memory and power are smooth JAX functions of GPU specs and batch
composition (`phases`, `memory`, `power`, `kv_transfer`), calibrated by gradient fit to
measured A100/H100 profiles (`calibrate`); they compose into a vectorised fluid/queueing
model of split clusters (`evaluate`), optimised by gradient (`optimize`).

References:
    P. Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
    Splitting", ISCA 2024, arXiv 2311.18677.
"""

from splitwise_jax.specs.batch import Batch as Batch
from splitwise_jax.specs.catalog import get_gpu as get_gpu
from splitwise_jax.specs.catalog import get_llm as get_llm
from splitwise_jax.specs.catalog import get_machine as get_machine
from splitwise_jax.specs.catalog import load_specs as load_specs
from splitwise_jax.specs.catalog import llm_names as llm_names
from splitwise_jax.specs.catalog import machine_names as machine_names
from splitwise_jax.cluster.cluster import Cluster as Cluster
from splitwise_jax.cluster.cluster import ClusterMetrics as ClusterMetrics
from splitwise_jax.cluster.cluster import Resolution as Resolution
from splitwise_jax.cluster.cluster import Scheduling as Scheduling
from splitwise_jax.cluster.cluster import Transfer as Transfer
# `evaluate` with a batching rule (cluster/batched.py): `jax.vmap` of it maps one
# configuration at a time on CPU, as `sweep` does; values and gradients are the model's.
from splitwise_jax.cluster.batched import evaluate as evaluate
from splitwise_jax.cluster.metrics import Status as Status
from splitwise_jax.cluster.strategies import STRATEGIES as STRATEGIES
from splitwise_jax.cluster.chunked import ChunkedScheduling as ChunkedScheduling
from splitwise_jax.cluster.designs import DESIGNS as DESIGNS
from splitwise_jax.cluster.designs import PRESETS as PRESETS
from splitwise_jax.cluster.designs import Design as Design
from splitwise_jax.cluster.designs import Pool as Pool
from splitwise_jax.cluster.designs import build_cluster as build_cluster
from splitwise_jax.cluster.designs import make_cluster as make_cluster
from splitwise_jax.cluster.designs import make_timing as make_timing
from splitwise_jax.cluster.designs import PHASE_MODELS as PHASE_MODELS
# One compiled program for every design of a strategy: names are static pytree metadata.
from splitwise_jax.cluster.designs import uniform_names as uniform_names
from splitwise_jax.specs.hardware import GPU as GPU
from splitwise_jax.specs.hardware import Machine as Machine
from splitwise_jax.specs.llm import LLM as LLM
from splitwise_jax.specs.paper import PAPER_SLO as PAPER_SLO
from splitwise_jax.phases.params import PhaseParams as PhaseParams
from splitwise_jax.phases.params import default_params as default_params
from splitwise_jax.phases.phases import mean_token_latency_s as mean_token_latency_s
from splitwise_jax.phases.phases import mixed_latency_s as mixed_latency_s
from splitwise_jax.phases.phases import prompt_latency_s as prompt_latency_s
from splitwise_jax.phases.phases import token_latency_s as token_latency_s
from splitwise_jax.phases.kv_transfer import layerwise_transfer_s as layerwise_transfer_s
from splitwise_jax.phases.kv_transfer import serialized_transfer_s as serialized_transfer_s
from splitwise_jax.phases.memory import fits as fits
from splitwise_jax.phases.power import provisioned_power_w as provisioned_power_w
# The measured profiles the phase model is calibrated on (pandas is imported inside the
# functions, so these cost `import splitwise_jax` nothing).
from splitwise_jax.phases.profiles import load_profiles as load_profiles
from splitwise_jax.phases.profiles import profile_medians as profile_medians
from splitwise_jax.cluster.workload import Workload as Workload
from splitwise_jax.cluster.workload import coarsen as coarsen
from splitwise_jax.cluster.workload import load_trace as load_trace

# `workload` (the preset/trace loader) shares its name with the module; expose it as
# `load_workload` so `splitwise_jax.cluster.workload` stays the module.
from splitwise_jax.cluster.workload import workload as load_workload  # noqa: E402

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
