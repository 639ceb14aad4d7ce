"""End-to-end training simulation: config validation, metrics, fidelities, invariants, CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import load_config, with_overrides
from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.iteration import build_iteration
from sim.training.run import model_flops_per_iteration, simulate_training
from workloads.errors import InvalidPlanError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt3-175b-a100.toml"

SMALL = {
    "model": {"name": "gpt3-7.5b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
    "training": {"seq_len": 2048, "global_batch": 32, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 4, "pp": 2, "dp": "auto", "sequence_parallel": True, "recompute": "selective", "zero": 1},
}


def _config(**overrides: object) -> dict:
    return with_overrides(copy.deepcopy(SMALL), [f"{k}={v}" for k, v in overrides.items()])


def test_metrics_have_the_interface_fields() -> None:
    metrics = simulate_training(_config(), RunOptions()).metrics()
    for key in (
        "iteration_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_s_per_gpu", "mfu", "hfu",
        "bubble_fraction", "exposed_communication_s", "peak_memory_bytes", "memory_bytes", "fits_in_memory", "fidelity",
    ):
        assert key in metrics
    assert set(metrics["exposed_communication_s"]) == {"tp", "pp", "dp", "cp", "ep"}
    assert set(metrics["memory_bytes"]) == {"weights", "gradients", "optimizer", "activations", "other"}
    assert metrics["fidelity"] == "des"


def test_model_flops_follow_korthikanti() -> None:
    setup = parse_training(_config())
    m, job = setup.model, setup.job
    s, h, layers, vocab = job.seq_len, m.hidden, m.layers, m.vocab
    assert setup.attention_kernel == "cudnn"
    # the causal kernel computes s (s + 1) / 2 scores per head: Eq. 3's s/6h attention term halved
    expected = 72 * job.global_batch * s * layers * h**2 * (1 + vocab / (12 * h * layers))
    expected += 6 * job.global_batch * layers * h * s * (s + 1)
    assert model_flops_per_iteration(setup) == pytest.approx(expected, rel=1e-9)  # pure arithmetic
    # the unfused kernels compute every score and then mask: Korthikanti's count exactly
    unfused = parse_training(_config(**{"training.attention_kernel": '"unfused"'}))
    expected = 72 * job.global_batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * h * layers))
    assert model_flops_per_iteration(unfused) == pytest.approx(expected, rel=1e-9)


def test_mfu_is_physical_and_hfu_counts_recompute() -> None:
    full = simulate_training(_config(**{"parallel.recompute": '"full"', "parallel.sequence_parallel": "false"}), RunOptions()).metrics()
    assert 0.0 < full["mfu"] < full["hfu"] < 1.0
    # full recompute re-runs the forward: hardware FLOPs are 4/3 of model FLOPs (+ ends not recomputed)
    assert full["hfu"] / full["mfu"] == pytest.approx(4 / 3, rel=0.03)


def test_analytic_and_des_agree_on_a_plan_without_overlap() -> None:
    config = _config(**{"parallel.pp": 4, "parallel.tp": 4, "cluster.num_gpus": 16, "training.global_batch": 64})
    des = simulate_training(config, RunOptions(fidelity="des")).metrics()["iteration_time_s"]
    analytic = simulate_training(config, RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
    # first/last stages carry the embedding and LM head, so stages are not uniform: 3 % here;
    # the 1 % agreement on uniform stages is asserted in tests/sim/test_training_des.py
    assert des == pytest.approx(analytic, rel=0.03)


def test_tensor_parallel_of_one_has_no_tp_communication() -> None:
    metrics = simulate_training(_config(**{"parallel.tp": 1, "parallel.pp": 2, "parallel.sequence_parallel": "false"}), RunOptions()).metrics()
    assert metrics["exposed_communication_s"]["tp"] == 0.0


def test_more_microbatches_shrink_the_bubble() -> None:
    small = simulate_training(_config(**{"training.global_batch": 8}), RunOptions(fidelity="analytic")).metrics()
    large = simulate_training(_config(**{"training.global_batch": 64}), RunOptions(fidelity="analytic")).metrics()
    assert large["bubble_fraction"] < small["bubble_fraction"]


@pytest.mark.parametrize(
    "overrides, rule",
    [
        ({"parallel.tp": 3}, "divisible by tp x pp x cp = 6"),
        ({"parallel.dp": 4}, "must equal cluster.num_gpus 16"),
        ({"model.name": '"gpt3-1.7b"', "parallel.tp": 16, "cluster.num_gpus": 32}, "must divide the 24 attention heads"),
        ({"training.global_batch": 33}, "global_batch 33 must be divisible"),
        ({"parallel.ep": 2}, "needs a mixture-of-experts model"),
        ({"parallel.pp": 16, "parallel.tp": 1, "cluster.num_gpus": 16, "parallel.schedule": '"interleaved"', "parallel.virtual_stages": 4}, "pp x virtual_stages = 64"),
    ],
)
def test_invalid_plans_name_the_rule(overrides: dict, rule: str) -> None:
    with pytest.raises(InvalidPlanError, match=rule):
        parse_training(_config(**overrides))


def test_a_plan_that_does_not_fit_reports_the_shortfall() -> None:
    config = _config(**{"model.name": '"gpt3-175b"', "parallel.tp": 1, "parallel.pp": 1, "cluster.num_gpus": 1,
                        "training.global_batch": 1, "parallel.sequence_parallel": "false"})
    metrics = simulate_training(config, RunOptions(fidelity="analytic")).metrics()
    assert metrics["fits_in_memory"] is False
    assert metrics["memory_shortfall_bytes"] == pytest.approx(metrics["peak_memory_bytes"] - 80 * 2**30, rel=1e-9)


def test_faster_network_is_never_slower() -> None:
    config = _config(**{"parallel.tp": 2, "parallel.pp": 1, "cluster.num_gpus": 16, "training.global_batch": 64})
    hdr = simulate_training(config, RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
    slow = simulate_training(with_overrides(config, ['cluster.network="ethernet-10g"']), RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
    assert slow >= hdr


def test_pipeline_work_is_symmetric_in_data_parallel_replicas() -> None:
    one = build_iteration(parse_training(_config(**{"cluster.num_gpus": 8, "training.global_batch": 16})))
    two = build_iteration(parse_training(_config()))
    assert [c.forward_s for s in one.pipeline.stages for c in s.chunks] == pytest.approx(
        [c.forward_s for s in two.pipeline.stages for c in s.chunks], rel=1e-12
    )
    assert [c.backward_input_s + c.backward_weight_s for s in one.pipeline.stages for c in s.chunks] == pytest.approx(
        [c.backward_input_s + c.backward_weight_s for s in two.pipeline.stages for c in s.chunks], rel=1e-12
    )
    # only the data-parallel work differs: a second replica adds gradient buckets
    assert not one.pipeline.stages[0].grad_sync and two.pipeline.stages[0].grad_sync


# ---- CLI ------------------------------------------------------------------------------------------


def test_cli_simulates_the_readme_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE), "--format", "json", "--fidelity", "analytic"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["fidelity"] == "analytic" and metrics["iteration_time_s"] > 0


def test_cli_writes_outputs_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "small.toml"
    config.write_text(
        '[model]\nname = "gpt3-1.7b"\n[cluster]\ngpu = "a100-sxm-80gb"\nnum_gpus = 4\n'
        "[training]\nseq_len = 2048\nglobal_batch = 8\n[parallel]\ntp = 1\npp = 4\n"
    )
    trace = tmp_path / "trace.json"
    assert main(["simulate", str(config), "--out", str(tmp_path / "out"), "--trace", str(trace)]) == 0
    assert "iteration time" in capsys.readouterr().out
    events = json.loads(trace.read_text())
    assert events["traceEvents"]
    for name in ("stages.csv", "ops.csv", "run.json", "metrics.json", "pipeline_timeline.png"):
        assert (tmp_path / "out" / name).exists()


def test_cli_rejects_a_bad_plan_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE), "--set", "parallel.tp=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "tp" in err[0]


def test_cli_rejects_unknown_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE), "--set", "parallel.tensor=8"]) == 2
    assert "unknown key 'tensor'" in capsys.readouterr().err


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert config["model"]["name"] == "gpt3-175b"


def test_interleaving_helps_most_at_small_batch() -> None:
    """Narayanan et al. 2021 (abstract, Fig. 12: GPT-3 175B on 96 A100): the interleaved schedule
    improves throughput by 10+ % over 1F1B at comparable memory, and the gain shrinks as the batch grows."""
    def iteration(batch: int, schedule: str, virtual: int) -> float:
        config = {
            "model": {"name": "gpt3-175b"},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 96},
            "training": {"seq_len": 2048, "global_batch": batch, "micro_batch": 1, "precision": "fp16"},
            "parallel": {"tp": 8, "pp": 12, "schedule": schedule, "virtual_stages": virtual, "recompute": "full"},
        }
        return simulate_training(config, RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]

    gain_small = iteration(12, "1f1b", 1) / iteration(12, "interleaved", 2) - 1
    gain_large = iteration(96, "1f1b", 1) / iteration(96, "interleaved", 2) - 1
    assert gain_small >= 0.10
    assert 0 < gain_large < gain_small


def test_context_parallel_ring_hides_behind_attention_and_all_gather_does_not() -> None:
    base = {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"seq_len": 65536, "global_batch": 2, "micro_batch": 1},
        "parallel": {"tp": 2, "cp": 8, "sequence_parallel": True, "recompute": "full"},
    }
    ring = simulate_training(base, RunOptions(fidelity="analytic")).metrics()
    gathered = simulate_training(with_overrides(base, ['parallel.cp_comm="all_gather"']), RunOptions(fidelity="analytic")).metrics()
    assert ring["exposed_communication_s"]["cp"] == 0.0  # 64k tokens: the K/V ring hides under attention
    assert gathered["exposed_communication_s"]["cp"] > 0.0
    with pytest.raises(InvalidPlanError, match="cp_comm = 'mesh'"):
        parse_training(with_overrides(base, ['parallel.cp_comm="mesh"']))
