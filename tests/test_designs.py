"""Tests of designs as data (designs.py), design files and pool flags (design_file.py),
and the provenance that evaluate reports per pool (_design_args.py, evaluate.py).

Everything here is host-side and fast except two compiled programs: one `evaluate`
vmapped over machine types and loads (the B200-vs-H100 ordering) and one run of the
evaluate command line.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.specs import catalog
from splitwise_jax.cli._design_args import pools_dict
from splitwise_jax.cluster.chunked import ChunkedScheduling
from splitwise_jax.cluster.cluster import Scheduling, evaluate
from splitwise_jax.io.design_file import design_from_dict, load_design, parse_pool_flag
from splitwise_jax.cluster.designs import (DESIGNS, PRESETS, Design, Pool, build_cluster, get_design, instance_machine,
                                   make_cluster, pool_provenance, uniform_names)
from splitwise_jax.evaluate import main as evaluate_main
from splitwise_jax.phases.params import load_params
from splitwise_jax.cluster.workload import workload

# ---------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------


def test_the_papers_six_designs_keep_their_attributes():
    # Callers (studies, the simulator CLI) read kind / prompt_machine / token_machine /
    # token_cap_frac of DESIGNS, which stays the paper's six.
    assert sorted(DESIGNS) == ["baseline-a100", "baseline-h100", "splitwise-aa", "splitwise-ha", "splitwise-hh",
                               "splitwise-hhcap"]
    ha = DESIGNS["splitwise-ha"]
    assert (ha.kind, ha.prompt_machine, ha.token_machine, ha.token_cap_frac) == ("splitwise", "dgx-h100",
                                                                                 "dgx-a100", 1.0)
    assert DESIGNS["splitwise-hhcap"].token_cap_frac == 0.7
    b = DESIGNS["baseline-a100"]
    assert (b.kind, b.prompt_machine, b.token_machine) == ("baseline", "dgx-a100", None)
    assert {d: PRESETS[d].kind for d in ("chunked-a100", "chunked-h100")} == {"chunked-a100": "chunked",
                                                                             "chunked-h100": "chunked"}


def _leaves_equal(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_make_cluster_is_build_cluster_of_the_preset(name):
    d = get_design(name)
    sizes = (12.0, 5.0 if d.kind == "splitwise" else None)
    assert _leaves_equal(make_cluster(name, 12.0, 5.0), build_cluster(d.with_counts(*sizes)))


def test_calibrated_gpus_keep_their_own_parameters():
    # Existing clusters are unchanged: A100 and H100 pools run on their own fits.
    c = make_cluster("splitwise-ha", 10.0, 4.0)
    assert c.prompt.params == load_params("h100-80gb") and c.token.params == load_params("a100-80gb")


def test_make_cluster_overrides():
    c = make_cluster("chunked-h100", 8.0, chunked_prefill_tokens=2048.0, prompt_cap_frac=0.8)
    assert isinstance(c.scheduling, ChunkedScheduling) and float(c.scheduling.token_budget) == 2048.0
    assert float(c.prompt.cap_frac) == 0.8 and c.n_token == 0.0
    with pytest.raises(ValueError, match="chunked_prefill_tokens applies"):
        make_cluster("splitwise-hh", 8.0, 2.0, chunked_prefill_tokens=512.0)


# ---------------------------------------------------------------------------------------
# Pools and designs
# ---------------------------------------------------------------------------------------


def test_any_machine_in_any_role():
    d = Design("mine", (Pool("prompt", "dgx-h200", 20), Pool("token", "mi300x-x8", 4, cap_frac=0.8)))
    c = build_cluster(d, model="llama3.1-70b")
    assert (c.kind, c.prompt.machine.name, c.token.machine.name) == ("splitwise", "dgx-h200", "mi300x-x8")
    assert float(c.token.cap_frac) == 0.8 and (c.n_prompt, c.n_token) == (20.0, 4.0)


def test_tensor_parallel_instances_share_the_machine():
    # tp = 4 on an 8-GPU machine: the pool counts 4-GPU instances, each with half the
    # machine's cost, provisioned and host power, and its own 4 GPUs of network.
    m = catalog.get_machine("dgx-h100")
    half = instance_machine(m, 4)
    assert half.gpus_per_machine == 4 and half.name == "dgx-h100/tp4"
    assert half.cost_per_hour == pytest.approx(m.cost_per_hour / 2)
    assert half.provisioned_power_w == pytest.approx(m.provisioned_power_w / 2)
    assert instance_machine(m, 8) is m and instance_machine(m) is m
    c = build_cluster(Design("tp4", (Pool("colocated", "dgx-h100", 10, tp=4),)), model="llama3.1-70b")
    assert c.prompt.machine.gpus_per_machine == 4
    with pytest.raises(ValueError, match="tp must divide"):
        instance_machine(m, 3)
    with pytest.raises(ValueError, match="tp must be"):
        instance_machine(m, 16)


@pytest.mark.parametrize("make, match", [
    (lambda: Design("x", (Pool("prompt", "dgx-h100", 1),)), "one colocated pool, or one prompt and one token"),
    (lambda: Design("x", (Pool("colocated", "dgx-h100", 1), Pool("token", "dgx-h100", 1))), "pools must be"),
    (lambda: Design("x", (Pool("prompt", "dgx-h100", 1), Pool("token", "dgx-h100", 1)), chunked_prefill_tokens=512),
     "chunked prefill applies to a colocated pool"),
    (lambda: Pool("decode", "dgx-h100", 1), "pool role must be one of"),
    (lambda: Pool("token", "dgx-h100", -2), "token pool count must be > 0"),
    (lambda: Pool("token", "dgx-h100", 2, cap_frac=1.2), "token pool cap_frac must lie in"),
    (lambda: Pool("token", "dgx-h100", 2, tp=0), "token pool tp must be an integer >= 1"),
    (lambda: build_cluster(Design("x", (Pool("colocated", "dgx-h100"),))), "has no count"),
    (lambda: build_cluster(Design("x", (Pool("colocated", "dgx-h100", 4, search_machines=("dgx-h100", "dgx-b200")),))),
     "one machine type per pool"),
    (lambda: build_cluster(Design("x", (Pool("colocated", "dgx-z", 4),))), "machine must be one of"),
    (lambda: build_cluster(Design("x", (Pool("colocated", "dgx-h100", 4, cap_frac=0.1),))), "cap_frac must lie in"),
    (lambda: build_cluster(Design("x", (Pool("colocated", "dgx-h100", 4),)), model="llama3.1-405b"),
     "does not fit on dgx-h100"),
])
def test_bad_designs_are_refused_with_a_clear_message(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------------------------------
# Design files and pool flags
# ---------------------------------------------------------------------------------------

DESIGN_TOML = """
name = "h200-b200"
[[pool]]
role = "prompt"
machine = "dgx-h200"
count = 20
[[pool]]
role = "token"
machine = ["dgx-b200", "dgx-h200"]
count = 4
cap = 0.8
tp = 4
[transfer]
mode = "layerwise"
bandwidth_gb_per_s = 50
[scheduler]
max_batch_tokens = 4096
max_batch_size = 256
"""


def test_design_file_round_trip(tmp_path):
    p = tmp_path / "d.toml"
    p.write_text(DESIGN_TOML)
    d = load_design(p)
    assert d.name == "h200-b200" and d.kind == "splitwise" and d.transfer_mode == "layerwise"
    tok = d.pool("token")
    assert (tok.machine, tok.machines, tok.count, tok.cap_frac, tok.tp) == ("dgx-b200", ("dgx-b200", "dgx-h200"),
                                                                            4.0, 0.8, 4)
    assert d.kv_bandwidth_bytes_per_s == 50e9 and float(d.scheduling.max_batch_tokens) == 4096.0
    # the batch-size cap reaches the model's scheduling and the simulator's config alike
    from splitwise_jax.simulate.policies import simulated
    assert float(d.scheduling.max_batch_size) == 256.0
    one = dataclasses.replace(d, pools=(d.pool("prompt"), dataclasses.replace(tok, search_machines=())))
    assert simulated(build_cluster(one))[1].max_batch_size == 256
    # The same design as JSON.
    j = tmp_path / "d.json"
    j.write_text(json.dumps({"pool": [{"role": "colocated", "machine": "dgx-h100", "count": 40}],
                             "scheduler": {"chunked_prefill_tokens": 512}}))
    dj = load_design(j)
    assert dj.kind == "chunked" and dj.chunked_prefill_tokens == 512.0


@pytest.mark.parametrize("data, match", [
    ({"pool": []}, "needs \\[\\[pool\\]\\] entries"),
    ({"pools": [{"role": "colocated", "machine": "dgx-h100"}]}, "unknown fields \\['pools'\\]"),
    ({"pool": [{"role": "colocated"}]}, "missing fields \\['machine'\\]"),
    ({"pool": [{"role": "decode", "machine": "dgx-h100"}]}, "role must be one of"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100", "count": -1}]}, "count must be a finite number > 0"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100", "count": "ten"}]}, "count must be a finite number"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100", "cap": 1.5}]}, "cap must be a finite number > 0 and <= 1"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100", "tp": 2.5}]}, "tp must be an integer"),
    ({"pool": [{"role": "colocated", "machine": []}]}, "machine must be a machine name or a non-empty list"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100", "gpus": 8}]}, "unknown fields \\['gpus'\\]"),
    ({"pool": [{"role": "prompt", "machine": "dgx-h100"}]}, "one colocated pool, or one prompt and one token"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100"}], "transfer": {"mode": "rdma"}}, "transfer.mode"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100"}], "scheduler": {"chunk": 5}}, "unknown fields"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100"}], "scheduler": {"chunked_prefill_tokens": 0}},
     "chunked_prefill_tokens must be a finite number > 0"),
    ({"pool": [{"role": "colocated", "machine": "dgx-h100"}], "scheduler": {"max_batch_size": 0}},
     "scheduler.max_batch_size must be a finite number > 0"),
])
def test_bad_design_files_name_the_field(data, match):
    with pytest.raises(ValueError, match=match):
        design_from_dict(data, "design file x.toml")


def test_unreadable_design_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[pool]\nrole = ")
    with pytest.raises(ValueError, match="is malformed"):
        load_design(bad)
    yaml = tmp_path / "d.yaml"
    yaml.write_text("pool: []\n")
    with pytest.raises(ValueError, match="must end in .toml or .json"):
        load_design(yaml)
    with pytest.raises(ValueError, match="does not exist"):
        load_design(tmp_path / "absent.toml")


@pytest.mark.parametrize("text, expect", [
    ("dgx-h100:27", ("dgx-h100", (), 27.0, 1.0, None)),
    ("dgx-h100:3@0.7", ("dgx-h100", (), 3.0, 0.7, None)),
    ("dgx-h100:54/4", ("dgx-h100", (), 54.0, 1.0, 4)),
    ("dgx-h100,dgx-b200@0.8", ("dgx-h100", ("dgx-h100", "dgx-b200"), None, 0.8, None)),
    ("dgx-h100", ("dgx-h100", (), None, 1.0, None)),
])
def test_pool_flags(text, expect):
    p = parse_pool_flag("--token-pool", text, "token")
    assert (p.machine, p.search_machines, p.count, p.cap_frac, p.tp) == expect


@pytest.mark.parametrize("text", ["dgx-h100:-3", "dgx-h100:nan", "dgx-h100:3@0", "dgx-h100:3@1.5", "dgx-h100:3/0",
                                  "dgx-h100:3/x", ":3", "dgx-h100,,dgx-b200", "dgx-h100,dgx-h100", "dgx-h100:inf"])
def test_bad_pool_flags(text):
    with pytest.raises(ValueError, match="--token-pool"):
        parse_pool_flag("--token-pool", text, "token")


# ---------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------


def test_every_pool_says_where_its_parameters_come_from():
    c = build_cluster(Design("x", (Pool("prompt", "dgx-h100", 4), Pool("token", "dgx-b200", 2, cap_frac=0.8))),
                      model="llama3.1-70b")
    prov = dict(pool_provenance(c))
    assert prov["prompt"].kind == "calibrated"
    assert prov["token"].label == "transferred-from:h100-80gb"
    pools = {p["role"]: p for p in pools_dict(c)}
    tok = pools["token"]["provenance"]
    assert tok["calibrated"] is False and tok["capped"] is True
    # The capped pool carries the capped expectation (split (c)'s capped rows).
    assert tok["expected_mape_pct"]["prompt"] == pytest.approx(prov["token"].expected_prompt_mape_capped_pct)
    assert pools["prompt"]["provenance"]["calibrated"] is True
    json.dumps(pools, allow_nan=False)  # NaN-free: unknown errors are null


def test_evaluate_prints_provenance_per_pool(capsys):
    code = evaluate_main(["--prompt-pool", "dgx-h100:6", "--token-pool", "dgx-h200:2@0.8", "--model", "llama3.1-8b",
                          "--workload", "coding", "--rate", "10", "--json", "--no-cache",
                          "--no-uncertainty"])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["design"]["kind"] == "splitwise" and d["design"]["model"] == "llama3.1-8b"
    roles = {p["role"]: p for p in d["pools"]}
    assert roles["prompt"]["provenance"]["label"] == "calibrated"
    assert roles["token"]["provenance"]["label"] == "transferred-from:h100-80gb"
    assert roles["token"]["provenance"]["expected_mape_pct"]["token"] > 0
    assert roles["token"]["count"] == 2.0 and roles["token"]["cap_frac"] == 0.8
    assert math.isfinite(d["ttft_s"]["p99"])


# ---------------------------------------------------------------------------------------
# Physical ordering across GPUs
# ---------------------------------------------------------------------------------------


def test_a_b200_pool_is_never_slower_than_an_h100_pool():
    # Same model, machines and load: the B200 has more FLOP/s, HBM bandwidth, memory
    # and NVLink than the H100 and runs on the same (transferred) parameters, so every
    # latency percentile is at most the H100's, from light load to overload. The H200
    # (H100 compute, more bandwidth and memory) sits in between. One vmapped program:
    # names made uniform, the machine's numbers are traced leaves.
    wl = workload("coding")
    rates = jnp.array([2.0, 15.0, 40.0, 120.0])
    machines = ("dgx-h100", "dgx-h200", "dgx-b200")
    clusters = [uniform_names(build_cluster(Design("x", (Pool("colocated", m, 4),)), model="llama3.1-70b"))
                for m in machines]
    stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, float) for x in xs]), *clusters)

    @jax.jit
    def run(cs, r):
        return jax.vmap(lambda c: jax.vmap(lambda rr: evaluate(c, wl.with_rate(rr)))(r))(cs)

    m = run(stacked, rates)
    lat = np.concatenate([np.asarray(m.ttft_s), np.asarray(m.tbt_s), np.asarray(m.e2e_s)], axis=-1)  # (3, R, 9)
    assert np.all(np.isfinite(lat))
    # 1e-9 relative: round-off of the percentile solver where both are equal.
    assert np.all(lat[2] <= lat[0] * (1 + 1e-9)), (lat[2] / lat[0])
    assert np.all(lat[1] <= lat[0] * (1 + 1e-9)), (lat[1] / lat[0])
    assert np.all(np.asarray(m.throughput_rps)[2] >= np.asarray(m.throughput_rps)[0] * (1 - 1e-9))


def test_scheduling_of_a_design_reaches_the_cluster():
    s = Scheduling(max_batch_tokens=4096.0, draft_pending_tokens=1024.0)
    d = dataclasses.replace(get_design("splitwise-hh").with_counts(10.0, 3.0), scheduling=s)
    assert build_cluster(d).scheduling == s


# ---------------------------------------------------------------------------------------
# Machine-type and budget choices of optimize (optimize/variants.py)
# ---------------------------------------------------------------------------------------


def test_variants_are_every_combination():
    from splitwise_jax.optimize.variants import variants

    d = Design("x", (Pool("prompt", "dgx-h100", 3, search_machines=("dgx-h100", "dgx-h200")),
                     Pool("token", "dgx-h100", search_machines=("dgx-h100", "dgx-b200", "mi300x-x8"))))
    v = variants(d)
    assert len(v) == 6 and "prompt=dgx-h200,token=mi300x-x8" in v
    assert all(p.count is None and not p.search_machines for x in v.values() for p in x.pools)
    c = variants(Design("c", (Pool("colocated", "dgx-h100"),), chunked_prefill_tokens=512.0), (256.0, 2048.0))
    assert sorted(x.chunked_prefill_tokens for x in c.values()) == [256.0, 2048.0]
    assert list(variants(get_design("splitwise-hh"))) == ["splitwise-hh"]  # nothing to choose: the design's name
    with pytest.raises(ValueError, match="colocated"):
        variants(get_design("splitwise-hh"), (512.0,))


def test_best_variant_follows_the_objective():
    from types import SimpleNamespace as NS

    from splitwise_jax.optimize.variants import best_variant

    res = {"a": NS(feasible=True, best=NS(objective=5.0)), "b": NS(feasible=True, best=NS(objective=3.0)),
           "c": NS(feasible=False, best=None)}
    assert best_variant(res, "cost") == "b" and best_variant(res, "throughput") == "a"
    assert best_variant({"c": res["c"]}, "cost") is None
