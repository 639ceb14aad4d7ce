"""Checkpointing and failures as goodput: closed forms, the Young/Daly optimum, the asynchronous
snapshot's order-of-magnitude cut of the stall, and one-line errors for bad tables."""

from __future__ import annotations

import contextlib
import io
import math

import pytest

from sim.cli import main
from sim.training.config import parse_training
from sim.training.estimate import estimate_training
from sim.training.goodput import checkpoint_bytes, optimal_interval_s
from tests.test_examples_training import EXAMPLES, _config, simulate

EXAMPLE = EXAMPLES / "train-checkpoint-goodput.toml"


def test_stalls_follow_the_closed_forms() -> None:
    setup = parse_training(_config(EXAMPLE))
    node, gpus = setup.cluster.node, setup.cluster.num_gpus
    total = checkpoint_bytes(setup)
    assert total == pytest.approx(setup.model.total_parameters() * 14.0)  # bf16 weights + Adam fp32 state
    sync = simulate(EXAMPLE, "analytic", "training.checkpoint.mode=sync")
    assert sync["checkpoint_stall_s"] == pytest.approx(total / (gpus / node.gpus_per_node) / 2e9, rel=1e-12)
    async_ = simulate(EXAMPLE, "analytic")
    assert async_["checkpoint_stall_s"] == pytest.approx(total / gpus / (node.device_to_host_Bps / 2), rel=1e-12)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_asynchronous_snapshots_cut_the_stall_by_an_order_of_magnitude(fidelity: str) -> None:
    # CheckFreq (FAST'21), DataStates-LLM (HPDC'24): snapshot to host memory, persist in the background
    sync = simulate(EXAMPLE, fidelity, "training.checkpoint.mode=sync")
    async_ = simulate(EXAMPLE, fidelity)
    assert sync["checkpoint_stall_s"] / async_["checkpoint_stall_s"] >= 10
    assert async_["goodput_tokens_per_s"] > sync["goodput_tokens_per_s"]
    assert async_["goodput_tokens_per_s"] < async_["tokens_per_s"]
    # a failure also loses the flush that had not finished: the checkpoint was not yet durable
    assert async_["expected_lost_work_s"] > sync["expected_lost_work_s"] - 1e-9


def test_young_daly_interval_maximises_goodput() -> None:
    base = simulate(EXAMPLE, "analytic", "training.checkpoint.mode=sync")
    best = base["optimal_checkpoint_interval_s"]
    delta, mtbf = base["checkpoint_stall_s"], base["job_mtbf_s"]
    assert best == pytest.approx(math.sqrt(2 * delta * mtbf) - delta, rel=1e-12)
    assert optimal_interval_s(3.0, 1.0) == pytest.approx(math.sqrt(6.0))  # Daly's correction only for delta < 2M
    goodput = {
        factor: simulate(EXAMPLE, "analytic", "training.checkpoint.mode=sync", f"training.checkpoint.interval_s={best * factor}")[
            "goodput_tokens_per_s"
        ]
        for factor in (0.5, 1.0, 2.0)
    }
    assert goodput[1.0] > goodput[0.5] and goodput[1.0] > goodput[2.0]


def test_mtbf_per_node_is_per_gpu_times_the_node() -> None:
    per_gpu = simulate(EXAMPLE, "analytic")
    config = _config(EXAMPLE)
    config["training"]["failures"] = {"mtbf_hours_per_node": 50673.0 / 8, "restart_s": 600.0}
    per_node = estimate_training(parse_training(config))
    assert per_node["job_mtbf_s"] == pytest.approx(per_gpu["job_mtbf_s"], rel=1e-12)
    assert per_node["goodput_tokens_per_s"] == pytest.approx(per_gpu["goodput_tokens_per_s"], rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["training.checkpoint.mode=lazy"], "mode = 'lazy' must be one of sync, async"),
        (["training.checkpoint.interval_s=0"], "interval_s = 0 must be a number > 0"),
        (["training.failures.mtbf_hours_per_node=3"], "exactly one of mtbf_hours_per_gpu, mtbf_hours_per_node"),
        (["training.failures.restart_s=-1"], "restart_s = -1 must be a number >= 0"),
    ],
)
def test_bad_tables_are_one_line_errors(overrides: list[str], words: str) -> None:
    err = io.StringIO()
    args = ["simulate", str(EXAMPLE)]
    for override in overrides:
        args += ["--set", override]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_failures_without_checkpoints_are_rejected() -> None:
    config = _config(EXAMPLE)
    del config["training"]["checkpoint"]
    with pytest.raises(Exception, match="needs \\[training.checkpoint\\]"):
        parse_training(config)
