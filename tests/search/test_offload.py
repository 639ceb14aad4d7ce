"""Offload placement (FlexGen LP + SimPy block schedule): the LP and the simulation agree on the
FlexGen T4 setups, an all-GPU policy has a closed-form timeline, and the LP's policy respects every
tier's capacity."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from search.offload import parse_offload, solve_placement
from search.run import SearchOptions, run_search
from sim.config import load_config, with_overrides
from sim.offload import OffloadPolicy, TierFractions, layer_terms, simulate_offload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "search-offload-opt-30b-t4.toml"


def _space(*overrides):
    return parse_offload(with_overrides(load_config(EXAMPLE), list(overrides)), SearchOptions())


@pytest.mark.parametrize(
    ("model", "gpu_batch", "num_gpu_batches"),
    # the best (gpu_batch, num_gpu_batches) of the full search for each model (README example output)
    [("opt-6.7b", 4, 1), ("opt-30b", 8, 24), ("opt-175b", 16, 32)],
)
def test_lp_and_simulation_agree_within_10_percent_on_flexgen_t4(model, gpu_batch, num_gpu_batches):
    space = _space(f'model.name="{model}"')
    terms = layer_terms(space.job, gpu_batch)
    placement = solve_placement(terms, num_gpu_batches, space)
    assert placement is not None
    run = simulate_offload(space.job, placement.policy, terms)
    assert run.output_tokens_per_s == pytest.approx(placement.output_tokens_per_s, rel=0.10)
    for tier, capacity in (("gpu", space.gpu_memory_bytes), ("cpu", space.cpu_memory_bytes), ("disk", space.disk_bytes)):
        assert placement.memory_bytes[tier] <= capacity * (1 + 1e-9)


def test_search_ranks_by_throughput_and_prunes_blocks_past_an_infeasible_one():
    config = with_overrides(load_config(EXAMPLE), ["search.gpu_batch=[8, 128]", "search.num_gpu_batches=[1, 32, 64]"])
    result = run_search(config, SearchOptions())
    rates = [p.output_tokens_per_s for p in result.placements]
    assert rates == sorted(rates, reverse=True)
    assert result.feasible and len(result.runs) == 1
    # a GPU batch of 128 prompts of 512 tokens needs a 9.4 GB prefill workspace plus its streaming
    # buffers: more than the T4 holds, so 128 x 1 is infeasible and 128 x 32, 128 x 64 are not tried
    assert result.pruned == {"memory_infeasible": 1, "larger_than_an_infeasible_block": 2}
    assert len(result.placements) == 3
    best = result.to_json()["best"]
    assert best["metrics"]["lp_vs_simulation_error"] == pytest.approx(0.0, abs=0.10)
    assert set(best["policy"]) == {"weights", "kv_cache", "activations"}


def test_all_on_gpu_policy_is_pure_compute_with_a_closed_form_timeline():
    space = _space('model.name="opt-6.7b"', 'search.weight_precision="int4"', 'search.kv_precision="int4"')
    terms = layer_terms(space.job, 8)
    on_gpu = TierFractions(gpu=1.0, cpu=0.0, disk=0.0)
    policy = OffloadPolicy(gpu_batch=8, num_gpu_batches=2, weights=on_gpu, kv_cache=on_gpu, activations=on_gpu)
    run = simulate_offload(space.job, policy, terms)
    steps = space.job.output_tokens
    expected = terms.layers * 2 * (terms.prefill_compute_s + sum(terms.decode_compute_s(i) for i in range(1, steps)))
    assert run.total_s == pytest.approx(expected, rel=1e-12)
    assert run.busy_s["cpu_to_gpu"] == 0.0 and run.bottleneck == "compute"
    # and the LP, with room to spare on the GPU, keeps everything there and predicts the same time
    placement = solve_placement(terms, 2, space)
    assert placement.policy.weights.gpu == pytest.approx(1.0) and placement.policy.kv_cache.gpu == pytest.approx(1.0)
    assert placement.block_s == pytest.approx(expected, rel=1e-9)


def test_streamed_weights_on_an_idle_gpu_take_the_pcie_time():
    # weights all on CPU, nothing else moves: the link carries every layer once per token step
    space = _space('model.name="opt-6.7b"')
    terms = layer_terms(space.job, 1)
    on_gpu = TierFractions(gpu=1.0, cpu=0.0, disk=0.0)
    policy = OffloadPolicy(gpu_batch=1, num_gpu_batches=1, weights=TierFractions(gpu=0.0, cpu=1.0, disk=0.0),
                           kv_cache=on_gpu, activations=on_gpu)
    run = simulate_offload(space.job, policy, terms)
    copies = terms.layers * space.job.output_tokens
    assert run.busy_s["cpu_to_gpu"] == pytest.approx(copies * (28e-6 + terms.weights_bytes / terms.cpu_to_gpu_Bps))
    assert run.bottleneck == "cpu_to_gpu"
    assert run.total_s >= run.busy_s["cpu_to_gpu"]


def test_cli_prints_one_json_object_and_bad_input_exits_2(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "sim", "search", str(EXAMPLE), "--format", "json", "--set", "search.gpu_batch=[4, 8]",
         "--set", "search.num_gpu_batches=[8, 16]", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["goal"] == "offload" and result["feasible"]
    assert (tmp_path / "candidates.csv").read_text().count("\n") == len(result["candidates"]) + 1
    bad = subprocess.run(
        [sys.executable, "-m", "sim", "search", str(EXAMPLE), "--set", "workload.prompt_tokens=0"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: workload.prompt_tokens = 0")
