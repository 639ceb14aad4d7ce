"""Serving-fleet planner: the MILP on capacities with a known optimum (split across GPU types,
availability caps, Mélange size buckets, disaggregated ratios), and an end-to-end search on a small
model whose chosen fleet meets the SLO when re-simulated and whose fleet.toml `llmsim simulate` runs."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from search.fleet import parse_fleet, search_fleet, solve_fleet
from search.run import SearchOptions
from sim.config import load_config

ROOT = Path(__file__).resolve().parents[2]

SMALL = {
    "model": {"name": "llama3-8b"},
    "workload": {"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 60, "seed": 0,
                 "prompt_tokens": {"distribution": "uniform", "min": 100, "max": 1500}, "output_tokens": 40},
    "slo": {"ttft_s": 0.5, "tpot_s": 0.05, "percentile": 90},
    "search": {"goal": "fleet", "target_rate_per_s": 5.0, "gpus": ["a100-sxm-80gb", "h100-sxm-80gb"],
               "prices_per_hour": {"a100-sxm-80gb": 1.0, "h100-sxm-80gb": 3.0}, "instance_tp": [1],
               "schedulers": ["vllm"]},
}


def _space(**search):
    config = json.loads(json.dumps(SMALL))
    config["search"].update(search)
    return parse_fleet(config, SearchOptions())


def _by_gpu(space, rates):
    """Capacity table giving every shape of a GPU type the rate(s) in ``rates[gpu]`` (one per bucket)."""
    return {(s, b): rates[s.gpu][b] for s in space.shapes for b in range(len(space.buckets))}


def test_milp_mixes_gpu_types_at_the_known_optimum():
    # A100: $1/h, 1 req/s; H100: $3/h, 4 req/s; 5 req/s: 5 A100 = $5, 2 H100 = $6, 1 H100 + 1 A100 = $4
    space = _space()
    caps = _by_gpu(space, {"a100-sxm-80gb": [1.0], "h100-sxm-80gb": [4.0]})
    fleet = solve_fleet(space, caps, 5.0)
    assert fleet.cost_per_hour == pytest.approx(4.0)
    assert fleet.gpus_by_type() == {"a100-sxm-80gb": 1, "h100-sxm-80gb": 1}
    assert sum(g.shares[0] for g in fleet.groups) == pytest.approx(1.0)
    # no A100s available: two H100s
    capped = _space(gpu_availability={"a100-sxm-80gb": 0})
    fleet = solve_fleet(capped, _by_gpu(capped, {"a100-sxm-80gb": [1.0], "h100-sxm-80gb": [4.0]}), 5.0)
    assert fleet.cost_per_hour == pytest.approx(6.0) and fleet.gpus_by_type() == {"h100-sxm-80gb": 2}


def test_size_buckets_send_short_prompts_to_the_cheap_gpu():
    # uniform 100..1500 prompts, split at 800: about half each. A100 serves short prompts at 2.5 req/s
    # and long ones at 0.25; H100 both at 2 req/s. 4 req/s = ~2 short + ~2 long: 1 A100 (short) +
    # 1 H100 (long) = $4 (all on H100: 2 x $3 = $6; all on A100: 1 + 8 = 9 A100 = $9).
    space = _space(target_rate_per_s=4.0, size_buckets=[800])
    assert [round(s, 1) for s in space.bucket_shares] == [0.5, 0.5]
    caps = _by_gpu(space, {"a100-sxm-80gb": [2.5, 0.25], "h100-sxm-80gb": [2.0, 2.0]})
    fleet = solve_fleet(space, caps, 4.0)
    assert fleet.cost_per_hour == pytest.approx(4.0)
    a100 = next(g for g in fleet.groups if g.option.gpu == "a100-sxm-80gb")
    # the H100 is nearly full with the long prompts, so the A100 takes (almost) all short ones and at
    # most the few long ones its slack allows (0.18 of an instance at 0.25 req/s: < 3 % of them); the H100 slack takes a few short ones
    assert a100.counts == (1,) and a100.shares[0] > 0.9 and a100.shares[1] < 0.03


def test_disaggregated_pools_take_their_ratio_from_each_roles_capacity():
    # prefill instance 6 req/s, decode instance 2 req/s at 6 req/s: 1 prefill + 3 decode instances
    space = _space(target_rate_per_s=6.0, schedulers=["disaggregated"], gpus=["h100-sxm-80gb"],
                   prices_per_hour={"h100-sxm-80gb": 3.0})
    caps = {(s, 0): 6.0 if s.role == "prefill" else 2.0 for s in space.shapes}
    fleet = solve_fleet(space, caps, 6.0)
    (group,) = fleet.groups
    assert group.counts == (1, 3) and fleet.cost_per_hour == pytest.approx(12.0)


def test_goodput_objective_serves_what_the_budget_buys():
    space = _space(objective="goodput", budget_per_hour=3.5)
    caps = _by_gpu(space, {"a100-sxm-80gb": [1.0], "h100-sxm-80gb": [4.0]})
    fleet = solve_fleet(space, caps, 5.0)
    # $3.5: one H100 (4 req/s, $3) beats three A100s (3 req/s); 0.5 left buys nothing
    assert fleet.served_rate_per_s == pytest.approx(4.0) and fleet.cost_per_hour == pytest.approx(3.0)


def test_end_to_end_fleet_meets_the_slo_and_fleet_toml_runs(tmp_path):
    config = json.loads(json.dumps(SMALL))
    config["search"].update(target_rate_per_s=6.0, capacity_requests=60, fleet_requests=120, top_k=3)
    config["search"].pop("prices_per_hour")  # catalog prices
    result = search_fleet(config, SearchOptions())
    assert result.feasible and result.best.metrics["slo_met"]
    assert result.best.metrics["slo_attainment"] >= 0.9
    cheapest_homogeneous = min(f.cost_per_hour for f in result.homogeneous.values() if f is not None)
    assert result.best.fleet.cost_per_hour <= cheapest_homogeneous + 1e-9 or result.repairs
    files = {p.name for p in result.write_outputs(tmp_path)}
    assert {"capacities.csv", "fleets.csv", "cost_vs_rate.png", "fleet.toml"} <= files
    fleet_toml = tmp_path / "fleet.toml"
    tomllib.loads(fleet_toml.read_text())
    out = subprocess.run([sys.executable, "-m", "sim", "simulate", str(fleet_toml), "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    if len(result.best.fleet.groups) == 1:  # the same stream, the same path: the same attainment
        assert json.loads(out.stdout)["slo_attainment"] == pytest.approx(result.best.metrics["slo_attainment"])


def test_unservable_ttft_exits_1_naming_the_prefill_time(tmp_path):
    path = tmp_path / "fleet.toml"
    example = load_config(ROOT / "examples" / "search-fleet-llama3-70b.toml")
    from sim.toml_writer import dumps

    example["slo"]["ttft_s"] = 0.01
    path.write_text(dumps(example))
    out = subprocess.run([sys.executable, "-m", "sim", "search", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    assert "slo.ttft_s = 0.01 s is below the prefill time of the median prompt" in out.stdout


def test_goodput_within_budget_sheds_what_the_budget_cannot_buy():
    config = json.loads(json.dumps(SMALL))
    config["search"].update(objective="goodput", budget_per_hour=4.5, target_rate_per_s=60.0, gpus=["h100-sxm-80gb"],
                            capacity_requests=60, fleet_requests=120)
    config["search"].pop("prices_per_hour")
    result = search_fleet(config, SearchOptions())
    fleet, m = result.best.fleet, result.best.metrics
    assert fleet.cost_per_hour <= 4.5 and fleet.gpus_by_type() == {"h100-sxm-80gb": 1}  # $4.25 per H100-hour
    assert 0 < fleet.served_rate_per_s < 60.0
    assert m["shed_requests"] > 0 and m["admitted_slo_attainment"] >= 0.9 and result.feasible
    assert m["slo_attainment"] == pytest.approx(m["admitted_slo_attainment"] * (1 - m["shed_requests"] / 120))


def test_memory_pruning_follows_the_serving_stack():
    # Llama 3 70B at TP 2 on H100 with 8,192 sequence slots: vLLM's fp32 logits (2 GiB) leave KV room;
    # TensorRT-LLM's runtime and decoder buffers for every slot (~2.9 MB each over its 128,256-entry
    # vocabulary, 23 GiB) do not, so the planner prunes that shape as `llmsim simulate` would refuse it
    def space(framework):
        config = json.loads(json.dumps(SMALL))
        config["model"] = {"name": "llama3-70b"}
        config["serving"] = {"framework": framework}
        config["search"].update(gpus=["h100-sxm-80gb"], prices_per_hour={"h100-sxm-80gb": 3.0}, instance_tp=[2],
                                max_num_seqs=[256, 8192])
        return parse_fleet(config, SearchOptions())

    assert [s.max_num_seqs for s in space("vllm").shapes] == [256, 8192]
    trtllm = space("trtllm")
    assert [s.max_num_seqs for s in trtllm.shapes] == [256]
    assert trtllm.pruned == {"does_not_fit_in_memory": 1}
