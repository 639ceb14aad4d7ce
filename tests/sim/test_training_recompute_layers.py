"""``[parallel] recompute_layers``: layers of each stage fully recomputed (Megatron's block method),
the rest under ``recompute``; in the memory model, the analytic fidelity and the DES."""

from __future__ import annotations

import copy

import pytest

from sim.cli import main
from sim.config import with_overrides
from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.costs import layer_passes, price_layer, group_links
from sim.training.iteration import build_iteration
from sim.training.memory import memory_per_stage
from sim.training.run import simulate_training
from workloads.errors import InvalidPlanError
from workloads.plan import ParallelPlan, chunk_recompute_counts

ONE_GPU = {  # no collectives: a recomputed layer's extra backward is exactly its forward
    "model": {"name": "gpt3-1.7b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
    "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 1, "pp": 1, "recompute": "none", "dp_comm_overlap": False},
}
PIPELINE = {  # uniform stages: analytic and DES agree
    "model": {"name": "gpt3-7.5b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
    "training": {"seq_len": 2048, "global_batch": 32, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 4, "pp": 4, "sequence_parallel": True, "recompute": "selective", "dp_comm_overlap": False},
}


def _config(base: dict, **overrides: object) -> dict:
    return with_overrides(copy.deepcopy(base), [f"{k}={v}" for k, v in overrides.items()])


def _peak(config: dict) -> float:
    setup = parse_training(config)
    stages = memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes)
    return stages[0].activations_bytes


def test_memory_decreases_linearly_in_recompute_layers() -> None:
    activations = [_peak(_config(ONE_GPU, **{"parallel.recompute_layers": r})) for r in range(0, 25, 4)]
    steps = [a - b for a, b in zip(activations, activations[1:])]
    assert all(step > 0 for step in steps)
    assert max(steps) == pytest.approx(min(steps), rel=1e-12)


def test_time_increases_by_the_recomputed_forward() -> None:
    base = parse_training(_config(ONE_GPU))
    layer = price_layer(base, layer_passes(base, False), group_links(base, 0))
    m = base.num_microbatches
    times = {}
    for r in (0, 5, 24):
        times[r] = simulate_training(_config(ONE_GPU, **{"parallel.recompute_layers": r}),
                                     RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
    for r in (5, 24):
        assert times[r] - times[0] == pytest.approx(m * r * layer.forward.total_s, rel=1e-9)


def test_every_layer_recomputed_equals_recompute_full() -> None:
    layers = parse_training(_config(PIPELINE)).model.layers // 4
    block = simulate_training(_config(PIPELINE, **{"parallel.recompute": "none", "parallel.recompute_layers": layers}),
                              RunOptions(fidelity="analytic")).metrics()
    full = simulate_training(_config(PIPELINE, **{"parallel.recompute": "full"}), RunOptions(fidelity="analytic")).metrics()
    for key in ("iteration_time_s", "peak_memory_bytes", "hfu"):
        assert block[key] == pytest.approx(full[key], rel=1e-12)


@pytest.mark.parametrize("recompute_layers", [2, [1, 2, 3, 0]])
def test_analytic_equals_des_with_recompute_layers(recompute_layers) -> None:
    config = _config(PIPELINE)
    config["parallel"]["recompute_layers"] = recompute_layers
    analytic = simulate_training(config, RunOptions(fidelity="analytic")).metrics()
    des = simulate_training(config, RunOptions(fidelity="des")).metrics()
    if isinstance(recompute_layers, int):  # uniform stages: the closed form is exact
        assert des["iteration_time_s"] == pytest.approx(analytic["iteration_time_s"], rel=0.01)
    else:  # uneven stages: the closed form bounds the DES from above within a few per cent
        assert des["iteration_time_s"] <= analytic["iteration_time_s"] * 1.01
    assert des["peak_memory_bytes"] == analytic["peak_memory_bytes"]


def test_per_stage_list_sets_each_stage() -> None:
    config = _config(PIPELINE)
    config["parallel"]["recompute_layers"] = [0, 8, 0, 0]
    setup = parse_training(config)
    stages = memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes)
    plain = parse_training(_config(PIPELINE))
    plain_stages = memory_per_stage(plain.model, plain.plan, plain.job, capacity_bytes=plain.cluster.gpu.hbm_capacity_bytes)
    assert stages[1].activations_bytes < plain_stages[1].activations_bytes
    assert [s.activations_bytes for i, s in enumerate(stages) if i != 1] == [
        s.activations_bytes for i, s in enumerate(plain_stages) if i != 1
    ]
    work = build_iteration(setup).pipeline
    plain_work = build_iteration(plain).pipeline
    assert work.stages[1].chunks[0].recompute_s > plain_work.stages[1].chunks[0].recompute_s
    assert work.stages[2].chunks[0].recompute_s == plain_work.stages[2].chunks[0].recompute_s


def test_interleaved_chunks_share_a_stage_s_recomputed_layers() -> None:
    plan = ParallelPlan(pp=2, virtual_stages=2, schedule="interleaved", recompute_layers=(3, 0))
    assert chunk_recompute_counts(8, plan) == (2, 0, 1, 0)  # chunks 0 and 2 run on stage 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "has 2 entries; needs pp = 4"),
        (-1, "must be >= 0"),
        (10, r"recompute_layers\[0\] = 10 exceeds the 9 layers of stage 0"),
        ("all", "must be an integer or a list"),
    ],
)
def test_bad_recompute_layers_name_the_rule(value, message) -> None:
    config = _config(PIPELINE)
    config["parallel"]["recompute_layers"] = value
    with pytest.raises((ConfigError, InvalidPlanError), match=message):
        parse_training(config)


def test_recompute_layers_with_full_recompute_is_rejected() -> None:
    with pytest.raises(InvalidPlanError, match="needs recompute = 'none' or 'selective'"):
        parse_training(_config(PIPELINE, **{"parallel.recompute": "full", "parallel.recompute_layers": 1}))


def test_cli_bad_recompute_layers_exits_2(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[model]\nname = "gpt3-7.5b"\n[cluster]\ngpu = "a100-sxm-80gb"\nnum_gpus = 16\n'
        "[training]\nseq_len = 2048\nglobal_batch = 32\n[parallel]\ntp = 4\npp = 4\nrecompute_layers = [1, 2]\n"
    )
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "recompute_layers" in err and "Traceback" not in err
