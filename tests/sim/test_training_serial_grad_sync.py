"""Gradients reduced after the backward (``dp_comm_overlap = false``, megatron-2021) are exposed
data-parallel time: both fidelities report the whole priced gradient all-reduce as exposed dp, the
and overlapping the buckets hides part of it."""

from __future__ import annotations

import pytest

from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.costs import group_links
from sim.training.data_parallel import grad_sync_work
from sim.training.run import simulate_training


def _config(overlap: bool, pp: int = 1) -> dict:
    return {
        "model": {"name": "gpt3-1.7b"},
        "cluster": {"gpu": "a100-sxm-80gb", "node": "dgx-a100", "network": "ib-hdr-fat-tree", "num_gpus": 16},
        "training": {"seq_len": 2048, "global_batch": 32, "micro_batch": 1, "precision": "fp16",
                     "framework": "megatron-2021"},
        "parallel": {"tp": 2, "pp": pp, "dp_comm_overlap": overlap},
    }


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
@pytest.mark.parametrize("pp", [1, 2])
def test_serial_grad_sync_is_exposed_dp(fidelity: str, pp: int) -> None:
    setup = parse_training(_config(False, pp))
    # the priced collective: every gradient bucket of a stage, summed (the critical stage's is exposed)
    priced_s = [sum(b.duration_s for b in grad_sync_work(setup, s, group_links(setup, s))) for s in range(pp)]
    assert min(priced_s) > 0.0
    serial = simulate_training(_config(False, pp), RunOptions(fidelity=fidelity))
    overlapped = simulate_training(_config(True, pp), RunOptions(fidelity=fidelity))
    stages = serial.work.pipeline.stages
    assert all(not s.grad_sync and s.serial_grad_sync_s > 0.0 for s in stages)  # nothing left to overlap
    exposed = serial.metrics()["exposed_communication_s"]["dp"]
    assert any(exposed == pytest.approx(stage_s, rel=1e-9) for stage_s in priced_s), (exposed, priced_s)
    # overlapping the same buckets with the backward hides all of them but the last one
    hidden = overlapped.metrics()["exposed_communication_s"]["dp"]
    assert 0.0 < hidden < exposed
    assert serial.metrics()["iteration_time_s"] > overlapped.metrics()["iteration_time_s"]
