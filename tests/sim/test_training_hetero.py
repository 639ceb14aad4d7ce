"""Heterogeneous training clusters ([cluster] groups, [parallel] stage_groups): the mixed cluster
sits between its one-generation counterparts, balancing beats the even split, each stage is priced
on its own GPU and checked against its own capacity, a one-group cluster is the homogeneous one
exactly, a small case's DES timeline is the hand-computed one, and bad groups give one-line errors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from hardware.catalog import get_gpu, get_network, get_node
from sim.cli import main
from sim.runner import RunOptions, simulate
from sim.toml_writer import dumps as dumps_toml
from sim.training.config import parse_training
from sim.training.iteration import build_iteration
from sim.training.pipeline_des import run_pipeline

A100 = {"gpu": "a100-sxm-80gb", "num_gpus": 4, "node": "dgx-a100"}
H100 = {"gpu": "h100-sxm-80gb", "num_gpus": 4, "node": "dgx-h100"}
NETWORK = "ib-ndr-fat-tree"


def config(groups: list[dict[str, Any]] | None = None, *, homogeneous: dict[str, Any] | None = None,
           **parallel: Any) -> dict[str, Any]:
    """Llama-3 8B on 8 GPUs, tp 2 x pp 4, one GPU type or groups."""
    cluster: dict[str, Any] = {"network": NETWORK}
    if groups is not None:
        cluster["groups"] = copy.deepcopy(groups)
    else:
        cluster.update(homogeneous or {})
        cluster["num_gpus"] = 8
    return {
        "model": {"name": "llama3-8b"},
        "cluster": cluster,
        "training": {"seq_len": 4096, "global_batch": 16, "micro_batch": 1},
        "parallel": {"tp": 2, "pp": 4, "sequence_parallel": True, "zero": 1, "recompute": "selective", **parallel},
    }


def run(cfg: dict[str, Any], fidelity: str) -> dict[str, Any]:
    return simulate(cfg, RunOptions(fidelity=fidelity)).metrics()


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_mixed_cluster_between_one_generation_clusters_and_balanced_beats_even(fidelity: str) -> None:
    a100 = run(config(homogeneous={"gpu": "a100-sxm-80gb", "node": "dgx-a100"}), fidelity)["iteration_time_s"]
    h100 = run(config(homogeneous={"gpu": "h100-sxm-80gb", "node": "dgx-h100"}), fidelity)["iteration_time_s"]
    even = run(config([A100, H100]), fidelity)["iteration_time_s"]
    balanced = run(config([A100, H100], layers_per_stage=[5, 5, 11, 11]), fidelity)["iteration_time_s"]
    assert h100 < balanced < even < a100
    # the balanced split gains a lot: the even split runs at the A100 stages' pace
    assert balanced < 0.8 * even
    # every split of the layers is no better than the balanced one (the slowest stage rules)
    for split in ([6, 6, 10, 10], [4, 4, 12, 12], [8, 8, 8, 8]):
        assert run(config([A100, H100], layers_per_stage=split), fidelity)["iteration_time_s"] > balanced


def test_one_group_is_the_homogeneous_cluster_exactly() -> None:
    for fidelity in ("analytic", "des"):
        grouped = run(config([{**H100, "num_gpus": 8}]), fidelity)
        plain = run(config(homogeneous={"gpu": "h100-sxm-80gb", "node": "dgx-h100"}), fidelity)
        assert grouped == plain


def test_each_stage_priced_on_its_own_gpu_and_checked_against_its_capacity() -> None:
    split = [5, 5, 11, 11]
    mixed = parse_training(config([A100, H100], layers_per_stage=split))
    assert mixed.stage_group == (0, 0, 1, 1)
    stages = build_iteration(mixed).pipeline.stages
    for gpu, node, owned in (("a100-sxm-80gb", "dgx-a100", (0, 1)), ("h100-sxm-80gb", "dgx-h100", (2, 3))):
        alone = build_iteration(parse_training(config(homogeneous={"gpu": gpu, "node": node}, layers_per_stage=split)))
        for s in owned:
            assert stages[s].chunks == alone.pipeline.stages[s].chunks
            assert stages[s].optimizer_s == alone.pipeline.stages[s].optimizer_s
    # memory: a 40 GB A100 group holding 13 layers per stage overflows on its first stage, not on the H100s
    small = dict(A100, gpu="a100-sxm-40gb", node="dgx-a100-40gb")
    result = simulate(config([small, H100], layers_per_stage=[13, 13, 3, 3]), RunOptions(fidelity="analytic"))
    capacities = [b.capacity_bytes for b in result.memory]
    assert capacities == [get_gpu("a100-sxm-40gb").hbm_capacity_bytes] * 2 + [get_gpu("h100-sxm-80gb").hbm_capacity_bytes] * 2
    m = result.metrics()
    assert not m["fits_in_memory"]
    fits = [b.fits_in_memory for b in result.memory]
    assert not fits[0] and fits[2:] == [True, True]
    assert run(config([A100, H100], layers_per_stage=[13, 13, 3, 3]), "analytic")["fits_in_memory"]  # 80 GB A100s hold it
    assert m["memory_shortfall_bytes"] == max(b.shortfall_bytes for b in result.memory) > 0
    # MFU is against the summed peak of both GPU types
    mfu = m["model_flops_per_s_per_gpu"] * 8 / (4 * get_gpu("a100-sxm-40gb").peak("bf16") + 4 * get_gpu("h100-sxm-80gb").peak("bf16"))
    assert m["mfu"] == pytest.approx(mfu, rel=1e-12)


def test_gpipe_two_stages_on_two_groups_exact_timeline() -> None:
    """GPipe, p = 2, m = 2, the slower A100 stage first: the last backward ends at
    2 F0 + F1 + B1 + 2 B0 + 2 d (d: one p2p transfer across the groups, at the A100 node's NIC share
    over the spine), from the two stages' own F and B (B incl. W)."""
    cfg = config([dict(A100, num_gpus=1), dict(H100, num_gpus=1)], schedule="gpipe")
    cfg["parallel"].update(tp=1, pp=2, sequence_parallel=False)
    cfg["training"].update(global_batch=2, seq_len=2048)
    setup = parse_training(cfg)
    work = build_iteration(setup).pipeline
    (c0,), (c1,) = work.stages[0].chunks, work.stages[1].chunks
    f0, b0 = c0.forward_s, c0.backward_input_s + c0.backward_weight_s
    f1, b1 = c1.forward_s, c1.backward_input_s + c1.backward_weight_s
    assert f0 > f1 and b0 > b1
    network, nics = get_network(NETWORK), get_node("dgx-a100").nics
    bandwidth = nics.bandwidth_Bps / network.oversubscription * network.efficiency  # one GPU per NIC on a DGX A100
    assert work.p2p_bandwidth_Bps[0] == pytest.approx(bandwidth, rel=1e-12)
    assert work.p2p_latency_s[0] == pytest.approx(network.endpoint_latency_s + 3 * network.per_hop_latency_s, rel=1e-12)
    d = c0.send_bytes / work.p2p_bandwidth_Bps[0] + work.p2p_latency_s[0]
    expected = 2 * f0 + f1 + b1 + 2 * b0 + 2 * d
    assert run_pipeline(work).pipeline_time_s == pytest.approx(expected, rel=1e-9)
    assert run(cfg, "analytic")["iteration_time_s"] == pytest.approx(run(cfg, "des")["iteration_time_s"], rel=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-h1"])
def test_fidelities_agree_on_a_balanced_mixed_cluster(schedule: str) -> None:
    extra: dict[str, Any] = {"schedule": schedule}
    if schedule == "interleaved":
        extra.update(virtual_stages=2, layers_per_stage=[3, 3, 5, 5, 2, 2, 6, 6])
    else:
        extra["layers_per_stage"] = [5, 5, 11, 11]
    analytic, des = (run(config([A100, H100], **extra), f)["iteration_time_s"] for f in ("analytic", "des"))
    # the closed form of 1F1B, and the longest paths of the program with each op at its own stage's
    # (and GPU's) chunk time for the others
    assert des == pytest.approx(analytic, rel=0.01)


def test_stage_groups_interleave_groups_in_any_order() -> None:
    """stage_groups [1, 0, 1, 0]: the H100 stages first; the cross-group boundaries are slower than
    [0, 0, 1, 1]'s single crossing, so that placement is no faster."""
    contiguous = run(config([A100, H100], stage_groups=[0, 0, 1, 1]), "analytic")
    alternating = parse_training(config([dict(A100, num_gpus=4), dict(H100, num_gpus=4)], stage_groups=[1, 0, 1, 0]))
    assert alternating.stage_group == (1, 0, 1, 0)
    crossings = run(config([A100, H100], stage_groups=[1, 0, 1, 0]), "analytic")
    assert crossings["exposed_communication_s"]["pp"] > contiguous["exposed_communication_s"]["pp"]


BAD = [
    ({"parallel": {"stage_groups": [0, 0, 1]}}, "has 3 entries; needs pp = 4"),
    ({"parallel": {"stage_groups": [0, 0, 0, 1]}}, "places 3 stages of 2 GPUs"),
    ({"parallel": {"stage_groups": [0, 0, 1, 2]}}, "entry 2 is not a group; allowed: 0..1"),
    ({"parallel": {"stage_groups": "0011"}}, "must be a list of group indices"),
    ({"parallel": {"tp": 16, "pp": 2}, "groups": [dict(A100, num_gpus=16), dict(H100, num_gpus=16)]},
     "parallel.tp = 16 does not fit group 0's node dgx-a100 (8 GPUs per NVLink domain)"),
    ({"groups": [dict(A100, num_gpus=3), dict(H100, num_gpus=5)]}, "groups[0] num_gpus = 3 must be a multiple of the 2 GPUs"),
    ({"groups": [dict(A100, bogus=1), H100]}, "groups[0] unknown key 'bogus'"),
    ({"groups": [dict(A100, node="dgx-h100"), H100]}, "node 'dgx-h100' holds h100-sxm-80gb, not gpu 'a100-sxm-80gb'"),
    ({"groups": []}, "must be a non-empty list"),
    ({"gpu": "a100-sxm-80gb"}, "cannot be given with groups"),
    ({"num_gpus": 16}, "must equal the groups' GPUs summed (8)"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_groups_give_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str) -> None:
    cfg = config([A100, H100])
    for key, value in change.items():
        if key == "parallel":
            cfg["parallel"].update(value)
        else:
            cfg["cluster"][key] = value
    path = tmp_path / "c.toml"
    path.write_text(dumps_toml(cfg))
    code = main(["simulate", str(path)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert message in lines[0]


def test_stage_groups_need_groups_and_serving_rejects_groups() -> None:
    from sim.errors import ConfigError

    cfg = config(homogeneous={"gpu": "h100-sxm-80gb"}, stage_groups=[0, 0, 0, 0])
    with pytest.raises(ConfigError, match="stage_groups = \\[0, 0, 0, 0\\] needs \\[cluster\\] groups"):
        parse_training(cfg)
    from sim.config import resolve_cluster  # what serving reads [cluster] with

    with pytest.raises(ConfigError, match="groups .* is for training runs"):
        resolve_cluster({"cluster": {"groups": [H100]}})


def test_example_reproduces_the_direction_at_size() -> None:
    """examples/train-hetero-a100-h100.toml (Llama-3 70B, 32 A100 + 32 H100): the balanced split
    [12, 13, 28, 27] (the MILP's) against the even one, and both against the one-generation clusters."""
    from sim.config import load_config

    example = load_config(Path(__file__).resolve().parents[2] / "examples" / "train-hetero-a100-h100.toml")
    balanced = run(example, "analytic")["iteration_time_s"]
    even = copy.deepcopy(example)
    even["parallel"]["layers_per_stage"] = []
    even_s = run(even, "analytic")["iteration_time_s"]
    one = []
    for gpu, node in (("a100-sxm-80gb", "dgx-a100"), ("h100-sxm-80gb", "dgx-h100")):
        c = copy.deepcopy(even)
        c["cluster"] = {"gpu": gpu, "node": node, "num_gpus": 64, "network": NETWORK}
        c["parallel"].pop("stage_groups")
        one.append(run(c, "analytic")["iteration_time_s"])
    assert one[1] < balanced < even_s < one[0]
    assert balanced / even_s == pytest.approx(0.664, abs=0.01)  # the DES: 27.19 / 40.95 s


def test_search_on_groups_chooses_the_split_with_the_milp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`llmsim search` on a heterogeneous cluster: the stage-assignment MILP, fed every stage's own
    layer seconds (priced on its group's GPU) and capacity, gives the faster H100 stages more layers;
    the DES confirms it beats the even split."""
    import json

    cfg = config([A100, H100])
    cfg["search"] = {"goal": "training"}
    path = tmp_path / "s.toml"
    path.write_text(dumps_toml(cfg))
    assert main(["search", str(path), "--format", "json", "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out)
    best = result["best"]
    split = best["parallel"]["layers_per_stage"]
    assert best["reason"] == "milp: layers_per_stage" and sum(split) == 32
    assert min(split[2:]) > max(split[:2])  # the H100 stages hold more layers
    even = next(c for c in result["candidates"] if c["reason"] == "even split")
    assert best["metrics"]["iteration_time_s"] < 0.8 * even["metrics"]["iteration_time_s"]
    assert (tmp_path / "out" / "best.toml").exists()
    from search.training_refine import stage_assignment_input
    from sim.training.pricing_cache import PricingCache

    data = stage_assignment_input(parse_training(config([A100, H100])), 80e9, PricingCache())
    assert data.dense_layer_s_per_stage[0] == data.dense_layer_s_per_stage[1] > 2 * data.dense_layer_s_per_stage[2]
