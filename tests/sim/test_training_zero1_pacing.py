"""ZeRO-1/2 parameter all-gather paced by the first forward (``param_gather_pacing = "bucket"``,
Megatron-Core's distributed optimizer with --overlap-param-gather): one gather per chunk before its
first F of the iteration, in bucket units, on the data-parallel stream; both fidelities."""

from __future__ import annotations

import dataclasses

import pytest

from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.stacks import get_stack
from sim.training.analytic import analytic_iteration
from sim.training.config import parse_training
from sim.training.costs import group_links
from hardware.collectives import Collective, collective_time_s
from sim.training.data_parallel import BUCKET_PARAMETERS, param_gather_work, stage_parameters_per_rank
from sim.training.pipeline_des import run_pipeline
from sim.training.run import simulate_training
from sim.training.work import CommWork
from tests.sim.test_training_des import EXACT, chunk, pipeline


def paced(schedule: str, pp: int, m: int, v: int, buckets: int, bucket_s: float, forward_s: float,
          slowdown: float = 1.0, gathered: bool = True):
    """pp stages of v chunks (F forward_s, B 2 forward_s); each chunk's paced gather: ``buckets`` of ``bucket_s``."""
    gather = CommWork(axis="dp", kind="all_gather", message_bytes=1.0, duration_s=buckets * bucket_s)
    work = pipeline(schedule, pp, m, chunk(forward_s, 2.0 * forward_s), v=v,
                    param_gather=(gather,) * v if gathered else (), overlap_slowdown=slowdown)
    if not gathered:
        return work
    return dataclasses.replace(work, stages=tuple(dataclasses.replace(
        s, param_gather_first_s=(bucket_s,) * v, param_gather_tail_share=(1.0 / buckets,) * v,
        param_gather_first_forward_only=True) for s in work.stages))


def test_exact_timeline_of_the_paced_first_forward() -> None:
    # one stage, m = 4, F 1 s, B 2 s; the gather is 4 buckets of a = 0.5 s (f = 0.25 s of forward per
    # bucket): gather 0..2, F0 from its first bucket at 0.5, 0.75 s of compute to 1.25, held until the
    # gather ends at 2, its last quarter 2..2.25; then B0 F1 B1 ... as without a gather (no B and no
    # later F waits): 12 + 1.25 s. The paced chain of Megatron-Core ends F0 at a + n max(a, f) = 2.5:
    # the model is a - f = 0.25 s early (within one bucket's all-gather)
    work = paced("1f1b", 1, 4, 1, 4, 0.5, 1.0)
    result = run_pipeline(work, trace=True)
    compute = [e for e in result.events if e.stream == "compute" and e.args.get("kind") != "W"]
    assert [e.name for e in compute][:3] == ["F0", "B0", "F1"]
    assert (compute[0].start_s, compute[0].end_s) == pytest.approx((0.5, 2.25), rel=EXACT)
    assert result.iteration_time_s == pytest.approx(13.25, rel=EXACT)
    assert result.exposed_comm_s["dp"] == pytest.approx(1.25, rel=EXACT)
    assert 0.5 + 4 * max(0.5, 0.25) - 2.25 == pytest.approx(0.5 - 0.25, rel=EXACT)
    gathers = [e for e in result.events if e.stream == "comm-dp" and e.name.startswith("param_gather")]
    assert [(e.start_s, e.end_s) for e in gathers] == [(0.0, 2.0)]  # once per iteration, not per micro-batch
    # f >= a: 4 buckets of 0.2 s beside 0.25 s of forward each: F0 ends at a + n f = 1.2, the paced chain's end
    result = run_pipeline(paced("1f1b", 1, 4, 1, 4, 0.2, 1.0))
    assert result.iteration_time_s == pytest.approx(12.0 + 0.2, rel=EXACT)


def test_every_chunk_gathers_once_before_its_first_forward() -> None:
    result = run_pipeline(paced("interleaved", 2, 4, 2, 3, 0.3, 0.5), trace=True)
    for stage in range(2):
        labels = [e.name for e in result.events if e.stage == stage and e.name.startswith("param_gather")]
        assert labels == ["param_gather 0.c0 fwd", "param_gather 0.c1 fwd"]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(1, 1), (1, 4), (2, 4), (4, 8)])
@pytest.mark.parametrize(("buckets", "bucket_s", "forward_s"), [(4, 0.5, 1.0), (4, 0.2, 1.0), (3, 1.0, 0.5), (1, 0.7, 1.0)])
@pytest.mark.parametrize("slowdown", [1.0, 1.25])
def test_analytic_equals_des_without_virtual_stages(schedule: str, pp: int, m: int, buckets: int, bucket_s: float,
                                                    forward_s: float, slowdown: float) -> None:
    work = paced(schedule, pp, m, 1, buckets, bucket_s, forward_s, slowdown)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=1e-9)
    assert analytic.exposed_comm_s["dp"] == pytest.approx(des.exposed_comm_s["dp"], rel=1e-9, abs=1e-12)
    base = run_pipeline(paced(schedule, pp, m, 1, buckets, bucket_s, forward_s, slowdown, gathered=False))
    assert des.iteration_time_s >= base.iteration_time_s + bucket_s * (1.0 - 1e-12)  # the first bucket is exposed


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (2, 4, 4), (2, 8, 8), (4, 8, 2), (4, 8, 4)])
@pytest.mark.parametrize(("buckets", "bucket_s", "forward_s"), [(3, 0.3, 0.5), (3, 1.0, 0.5), (2, 1.0, 0.25), (2, 0.1, 1.0)])
@pytest.mark.parametrize("slowdown", [1.0, 1.25])
def test_interleaved_analytic_follows_the_gathers_that_pace_the_first_forwards(
        pp: int, m: int, v: int, buckets: int, bucket_s: float, forward_s: float, slowdown: float) -> None:
    # a chunk's gather longer than the pp forwards its stage runs before the next chunk's first F paces
    # the first forwards (bucket_s 1.0: 2-3 s per gather against pp x 0.25-0.5 s); following every
    # global chunk's first forward, the closed form is within 0.3 % of the DES there and 2 % elsewhere,
    # never above it (the chain through the first chunks and the later gathers' slowdown alone read up
    # to 23.5 % short at pp 2, v 4)
    work = paced("interleaved", pp, m, v, buckets, bucket_s, forward_s, slowdown)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=0.003 if bucket_s == 1.0 else 0.02)
    assert analytic.iteration_time_s <= des.iteration_time_s + 1e-9


MCORE = {
    "model": {"name": "llama3-8b"},
    "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 32},
    "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "precision": "bf16", "framework": "megatron-core"},
    "parallel": {"tp": 2, "pp": 1, "dp": 16, "zero": 1, "sequence_parallel": True},
}


def test_stack_settings() -> None:
    assert get_stack("training", "megatron-core").settings["param_gather_pacing"] == "bucket"
    assert get_stack("training", "megatron-bridge").settings["param_gather_pacing"] == "bucket"
    for name in ("nemo", "nemo-1.17", "nemo-1.20", "deepspeed-zero-2021", "megatron-2021", "torchtitan", "llm-foundry"):
        assert get_stack("training", name).settings["param_gather_pacing"] == "free", name


def test_gathers_of_a_zero1_plan_are_its_buckets() -> None:
    setup = parse_training(MCORE)
    links = group_links(setup, 0)
    gathers = param_gather_work(setup, 0, links)
    params = stage_parameters_per_rank(setup, 0)
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * 16)
    table = 128_256 * 4096 / 2  # the embedding closes the last bucket, gathered first: its own, then full ones
    full = int((params - table) // bucket)
    assert gathers.first_forward_only
    assert len(gathers.gathers) == 1 and gathers.gathers[0].message_bytes == pytest.approx(params * 2.0, rel=EXACT)
    assert gathers.tail_share == (pytest.approx(1.0 / (full + 1), rel=EXACT),)
    first = params - full * bucket
    assert table < first < table + bucket
    assert gathers.first_unit_s[0] == collective_time_s(Collective.ALL_GATHER, first * 2.0, links["dp"])
    assert 0.0 < gathers.first_unit_s[0] < gathers.gathers[0].duration_s
    free = parse_training({**MCORE, "training": {**MCORE["training"], "param_gather_pacing": "free"}})
    assert param_gather_work(free, 0, group_links(free, 0)).gathers == ()
    serial = parse_training({**MCORE, "parallel": {**MCORE["parallel"], "dp_comm_overlap": False}})
    assert param_gather_work(serial, 0, group_links(serial, 0)).gathers == ()  # after the optimizer instead


@pytest.mark.parametrize("parallel", [
    {"tp": 2, "pp": 1, "dp": 16},
    {"tp": 2, "pp": 4, "dp": 4, "schedule": "1f1b"},
    {"tp": 2, "pp": 4, "dp": 4, "schedule": "interleaved", "virtual_stages": 2},
])
def test_fidelities_agree_on_zero1_plans_end_to_end(parallel: dict) -> None:
    config = {**MCORE, "parallel": {**MCORE["parallel"], **parallel}}
    free = {**config, "training": {**config["training"], "param_gather_pacing": "free"}}
    des = simulate_training(config, RunOptions(fidelity="des")).metrics()
    analytic = simulate_training(config, RunOptions(fidelity="analytic")).metrics()
    hidden = simulate_training(free, RunOptions(fidelity="des")).metrics()
    assert des["iteration_time_s"] > hidden["iteration_time_s"]
    assert analytic["iteration_time_s"] == pytest.approx(des["iteration_time_s"], rel=0.01)


def test_bad_pacing_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="param_gather_pacing"):
        parse_training({**MCORE, "training": {**MCORE["training"], "param_gather_pacing": "eager"}})
