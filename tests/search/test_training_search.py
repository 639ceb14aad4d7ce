"""`llmsim search` for training plans end to end: funnel, runnable best.toml, determinism across
executors (incl. a dask LocalCluster), infeasible searches, bad input, optimality against an
exhaustive loop, and the MILP split against the even one in the DES."""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import itertools
import json
import tomllib

import pytest

from search.run import SearchOptions, run_search
from search.training_milp import assign_layers
from search.training_refine import stage_assignment_input
from sim.cli import main
from sim.config import load_config
from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.estimate import estimate_training
from sim.training.pricing_cache import PricingCache
from sim.training.run import simulate_training
from sim.toml_writer import dumps as dumps_toml
from workloads.errors import InvalidPlanError

SMALL = {
    "model": {"name": "gpt3-1.7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
    "training": {"seq_len": 2048, "global_batch": 64, "precision": "bf16"},
    "search": {"goal": "training", "top_k": 3, "micro_batch": [1, 2], "zero": [0, 1], "recompute": ["none", "full"],
               "schedule": ["1f1b", "interleaved"], "train_tokens": 1e9},
}


def _write(tmp_path, config, name="search.toml"):
    path = tmp_path / name
    path.write_text(dumps_toml(config))
    return path


def _cli(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _without_wall_time(result) -> dict:
    data = result.to_json()
    data.pop("wall_time_s")
    return data


def test_small_search_funnel_and_runnable_best(tmp_path) -> None:
    path = _write(tmp_path, SMALL)
    code, out, _ = _cli(["search", str(path), "--format", "json", "--workers", "1", "--out", str(tmp_path / "out")])
    assert code == 0
    data = json.loads(out)
    funnel = data["funnel"]
    assert funnel["enumerated"] == sum(funnel["pruned"].values()) + funnel["screened"]
    assert funnel["screened"] >= funnel["fits_in_memory"] >= funnel["meets_constraints"] > 0
    assert funnel["des_reranked"] == len(data["candidates"]) == 3
    assert data["feasible"] and data["best"]["fidelity"] == "des"
    rates = [c["metrics"]["tokens_per_s"] for c in data["candidates"]]
    assert rates == sorted(rates, reverse=True)
    assert data["pareto"][0]["reason"].startswith("highest throughput")
    # best.toml runs as is and reproduces the reported numbers, in both fidelities
    best = tmp_path / "out" / "best.toml"
    with best.open("rb") as f:
        config = tomllib.load(f)
    assert "search" not in config
    des = simulate_training(config, RunOptions(fidelity="des")).metrics()
    analytic = simulate_training(config, RunOptions(fidelity="analytic")).metrics()
    assert des["tokens_per_s"] == data["best"]["metrics"]["tokens_per_s"]
    assert analytic["tokens_per_s"] == data["best"]["analytic_tokens_per_s"]
    code, out, _ = _cli(["simulate", str(best), "--format", "json"])
    assert code == 0 and json.loads(out)["tokens_per_s"] == data["best"]["metrics"]["tokens_per_s"]
    for name in ("candidates.csv", "pareto.csv", "pareto.png", "best.toml"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    with (tmp_path / "out" / "candidates.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["count"]) for r in rows) == funnel["enumerated"]
    assert sum(1 for r in rows if r["status"] == "screened") == funnel["screened"]
    assert {r["rule"] for r in rows if r["status"] == "pruned"} == set(funnel["pruned"])


def test_validation_rules_are_the_prune_rules() -> None:
    config = copy.deepcopy(SMALL)
    config["search"]["tp"] = [1, 5]  # gpt3-1.7b has 24 heads
    config["search"]["pp"] = [1, 2]
    config["cluster"]["num_gpus"] = 20
    pruned = run_search(config, SearchOptions(workers=1)).to_json()["pruned"]
    assert pruned["parallel.tp N must divide the N attention heads of model gpt3-1.7b"] > 0
    with pytest.raises(InvalidPlanError, match="parallel.tp 5 must divide the 24 attention heads"):
        parse_training({**config, "parallel": {"tp": 5}, "search": {}})


def test_results_identical_on_every_executor() -> None:
    serial = _without_wall_time(run_search(SMALL, SearchOptions(workers=1)))
    pooled = _without_wall_time(run_search(SMALL, SearchOptions(workers=2)))
    assert json.dumps(serial) == json.dumps(pooled)


def test_dask_local_cluster_gives_the_local_result() -> None:
    distributed = pytest.importorskip("dask.distributed")
    config = copy.deepcopy(SMALL)
    config["search"].update(top_k=2, zero=[1], micro_batch=[1])  # small: the cluster's start-up dominates
    local = _without_wall_time(run_search(config, SearchOptions(workers=2)))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = _without_wall_time(run_search(config, SearchOptions(dask_address=cluster.scheduler_address)))
    assert json.dumps(remote) == json.dumps(local)


def test_no_feasible_plan_exits_1_naming_memory(tmp_path) -> None:
    config = copy.deepcopy(SMALL)
    config["model"] = {"name": "gpt3-175b"}
    config["cluster"]["num_gpus"] = 8
    config["search"].update(tp=[8], pp=[1], zero=[0])
    code, out, _ = _cli(["search", str(_write(tmp_path, config))])
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith("binding constraint"))
    assert "memory" in line and "GiB over" in line


def test_min_memory_headroom_is_a_constraint() -> None:
    config = copy.deepcopy(SMALL)
    config["search"]["min_memory_headroom"] = 0.5
    result = run_search(config, SearchOptions(workers=1))
    for plan in result.ranked:
        assert plan.headroom_bytes >= 0.5 * plan.context.capacity_bytes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"objective": "speed"}, "objective = 'speed' must be one of throughput, time_to_train, cost"),
        ({"objective": "cost", "train_tokens": None}, "needs train_tokens"),
        ({"layers_per_stage": [1]}, "the planner chooses it"),
        ({"pp": "many"}, "must be \"auto\" or a list of integers"),
        ({"gpus": ["a100-pcie-80gb"], "objective": "cost"}, "has no price in the catalog"),
        ({"colour": 1}, "unknown key 'colour'"),
    ],
)
def test_bad_search_input_exits_2(tmp_path, change, message) -> None:
    config = copy.deepcopy(SMALL)
    for key, value in change.items():
        if value is None:
            config["search"].pop(key)
        else:
            config["search"][key] = value
    code, _, err = _cli(["search", str(_write(tmp_path, config))])
    assert code == 2
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_cost_objective_uses_catalog_prices_and_overrides() -> None:
    config = copy.deepcopy(SMALL)
    config["search"].update(objective="cost", gpus=["a100-sxm-80gb", "h100-sxm-80gb"],
                            prices_per_hour={"h100-sxm-80gb": 100.0})  # an absurd H100 price: A100 wins
    best = run_search(config, SearchOptions(workers=1)).to_json()["best"]
    assert best["gpu"] == "a100-sxm-80gb" and best["cost_to_train_usd"] > 0


def test_optimality_against_an_exhaustive_loop() -> None:
    """GPT-3 175B on 1,024 A100: the search's analytic best over every tp, pp, v, micro-batch,
    recompute and ZeRO stage of this (reduced, for CI speed) grid equals a plain loop over it."""
    base = {
        "model": {"name": "gpt3-175b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1024},
        "training": {"seq_len": 2048, "global_batch": 1536, "precision": "fp16", "framework": "megatron-2021",
                     "attention_kernel": "unfused"},
    }
    space = {"tp": [4, 8], "pp": [8, 16], "micro_batch": [1, 2], "zero": [0, 1], "recompute": ["selective", "full"],
             "schedule": ["1f1b", "interleaved"], "virtual_stages": [1, 2, 3], "sequence_parallel": [True]}
    config = {**base, "search": {"goal": "training", "top_k": 1, **space}}
    result = run_search(config, SearchOptions(workers=1))
    screened = [row for row in result.rows if row.metrics is not None and not row.violates]
    search_best = max(row.metrics[1] for row in screened)  # tokens_per_s of the screening
    cache = PricingCache()
    exhaustive_best = 0.0
    for tp, pp, mb, zero, recompute, schedule, v in itertools.product(
        space["tp"], space["pp"], space["micro_batch"], space["zero"], space["recompute"], space["schedule"],
        space["virtual_stages"],
    ):
        candidate = copy.deepcopy(base)
        candidate["training"]["micro_batch"] = mb
        candidate["parallel"] = {"tp": tp, "pp": pp, "zero": zero, "recompute": recompute, "schedule": schedule,
                                 "virtual_stages": v, "sequence_parallel": True}
        try:
            metrics = estimate_training(parse_training(candidate), cache)
        except (InvalidPlanError, ConfigError):
            continue
        if metrics["fits_in_memory"]:
            exhaustive_best = max(exhaustive_best, metrics["tokens_per_s"])
    assert search_best == exhaustive_best


def test_milp_split_beats_the_even_split_in_the_des() -> None:
    """Llama 3 8B (128k vocabulary) at pp 8: the LM head makes the last stage the slowest; the
    MILP's uneven split, simulated by the DES, is faster than the even one."""
    config = {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        "training": {"seq_len": 8192, "global_batch": 64, "micro_batch": 1, "precision": "bf16"},
        "parallel": {"tp": 1, "pp": 8, "recompute": "selective", "zero": 1},
    }
    setup = parse_training(config)
    split = assign_layers(stage_assignment_input(setup, setup.cluster.gpu.hbm_capacity_bytes, PricingCache()))
    assert split.layers_per_chunk != (4,) * 8 and split.layers_per_chunk[-1] < 4
    even = simulate_training(config, RunOptions(fidelity="des")).metrics()
    uneven_config = copy.deepcopy(config)
    uneven_config["parallel"]["layers_per_stage"] = list(split.layers_per_chunk)
    uneven = simulate_training(uneven_config, RunOptions(fidelity="des")).metrics()
    assert uneven["fits_in_memory"]
    assert uneven["tokens_per_s"] > 1.05 * even["tokens_per_s"]


def test_example_config_parses() -> None:
    config = load_config("examples/search-gpt3-1t-a100.toml")
    assert config["search"]["goal"] == "training"


def test_narayanan_table1_row_best_beats_the_published_plan() -> None:
    """Narayanan et al. 2021 Table 1, GPT 3.6B on 64 A100 (batch 512): with the model, GPU count and
    global batch fixed and the rest free, the best plan's DES throughput is at least that of the
    published plan (TP 2, full recompute) simulated the same way. All rows: benchmarks/search_narayanan_table1.py."""
    from validation.training_suite import published_rows, row_config

    row = next(r for r in published_rows("training.csv") if r["row"] == "narayanan-3.6b")
    published = simulate_training(row_config(row), RunOptions(fidelity="des")).metrics()
    config = row_config(row)
    config.pop("parallel")
    config["training"].pop("micro_batch")
    config["search"] = {"goal": "training", "top_k": 2, "sequence_parallel": [False, True], "micro_batch": [1, 2, 4]}
    best = run_search(config, SearchOptions(workers=1)).to_json()["best"]
    assert best["metrics"]["tokens_per_s"] >= published["tokens_per_s"]


@pytest.mark.parametrize(("schedule", "chunks"), [("hanayo", 4), ("zb-v", 2), ("interleaved", 3), ("1f1b", 1)])
def test_candidate_config_runs_the_candidates_chunks(schedule: str, chunks: int) -> None:
    # a candidate's virtual_stages counts chunks per stage; hanayo's [parallel] value counts waves
    from search.training_space import Candidate, build_setup, candidate_config, context_setup, parse_space

    config = copy.deepcopy(SMALL)
    config["model"] = {"name": "gpt3-1.7b"}
    space = parse_space(config)
    context = space.contexts[0]
    candidate = Candidate(0, 64, 1, 1, 4, 1, 1, 0, schedule, chunks, "none", False, "none", False, False, "ring")
    plan = parse_training(candidate_config(context, candidate)).plan
    assert plan == build_setup(context_setup(context), candidate).plan
    assert plan.virtual_stages == chunks


def test_search_tries_experts_folded_over_the_tp_ranks(tmp_path) -> None:
    # Qwen3 30B-A3B on 16 H100 at TP 2: EP 16 fits only with the experts folded over the tp ranks
    # (etp 1: ep x etp = 16 divides tp x dp = 16; unfolded, ep must divide dp = 8)
    config = {
        "model": {"name": "qwen3-30b-a3b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"seq_len": 4096, "global_batch": 64, "precision": "bf16"},
        "parallel": {"sequence_parallel": True},
        "search": {"goal": "training", "top_k": 2, "tp": [2], "pp": [1], "cp": [1], "ep": [8, 16], "etp": [0, 1],
                   "zero": [1], "schedule": ["1f1b"], "recompute": ["full"], "micro_batch": [1]},
    }
    code, out, _ = _cli(["search", str(_write(tmp_path, config)), "--format", "json", "--workers", "1",
                         "--out", str(tmp_path / "out")])
    assert code == 0
    data = json.loads(out)
    with (tmp_path / "out" / "candidates.csv").open() as f:
        screened = {(r["ep"], r["etp"]) for r in csv.DictReader(f) if r["status"] == "screened"}
    assert {("8", "0"), ("8", "1"), ("16", "1")} <= screened and ("16", "0") not in screened
    # the best folds EP 8 into one node (ranks 0-7); unfolded, its EP group strides over both nodes
    assert (data["best"]["parallel"]["ep"], data["best"]["parallel"]["etp"]) == (8, 1)
    # best.toml runs as is, and the search's shared-cache estimate is the fresh one
    with (tmp_path / "out" / "best.toml").open("rb") as f:
        best = tomllib.load(f)
    fresh = simulate_training(best, RunOptions(fidelity="analytic")).metrics()
    assert fresh["tokens_per_s"] == data["best"]["analytic_tokens_per_s"]


def test_search_tries_the_combined_1f1b_where_megatron_runs_it(tmp_path) -> None:
    # Qwen3 30B-A3B on 16 H100, EP 8 over the dp ranks: listed, ep_comm_overlap doubles the MoE plans;
    # at pp 2 only the interleaved ones can take it (Megatron-Core's rule), and hiding the all-to-alls
    # behind the other micro-batch's compute makes the best plan one that does
    config = {
        "model": {"name": "qwen3-30b-a3b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"seq_len": 4096, "global_batch": 256, "precision": "bf16"},
        "search": {"goal": "training", "top_k": 2, "tp": [1], "pp": [2], "cp": [1], "ep": [8], "zero": [1],
                   "schedule": ["1f1b", "interleaved"], "virtual_stages": [1, 2], "recompute": ["none"],
                   "micro_batch": [1], "ep_comm_overlap": [False, True]},
    }
    code, out, _ = _cli(["search", str(_write(tmp_path, config)), "--format", "json", "--workers", "1",
                         "--out", str(tmp_path / "out")])
    assert code == 0
    with (tmp_path / "out" / "candidates.csv").open() as f:
        rows = list(csv.DictReader(f))
    screened = {(r["schedule"], r["ep_comm_overlap"]) for r in rows if r["status"] == "screened"}
    assert ("interleaved", "True") in screened and ("interleaved", "False") in screened
    assert ("1f1b", "True") not in screened
    assert any("ep_comm_overlap" in r["rule"] for r in rows if r["status"] == "pruned")
    best = json.loads(out)["best"]["parallel"]
    assert best["ep_comm_overlap"] is True and best["schedule"] == "interleaved"
    with (tmp_path / "out" / "best.toml").open("rb") as f:
        assert tomllib.load(f)["parallel"]["ep_comm_overlap"] is True
