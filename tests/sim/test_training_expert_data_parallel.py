"""MoE expert parameters are data-parallel over the expert data-parallel group ("edp": tp x cp x dp /
(ep x etp) ranks, every (etp x ep)-th rank of a stage), apart from the dense parameters (over "dp"),
as Megatron-Core's DDP and distributed optimizer keep them (megatron/core/distributed/
distributed_data_parallel.py ``expert_parallel_buffers``; megatron/core/optimizer/__init__.py): the
gradient buckets, the ZeRO-1/2 optimizer shard and its parameter all-gather; and under ZeRO-3 /
FSDP as torchtitan (experts ``fully_shard``ed over ``dp_shard_mod_ep`` / ``efsdp``) and Megatron-Core's
custom FSDP (expert buffers over the expert data-parallel group) shard them: each layer unit's
all-gather, the gradient reduce-scatter and the optimizer shard; under HSDP over the expert group's
ranks inside a dense shard group, replicated across them. Dense models are covered by the golden files
(unchanged)."""

from __future__ import annotations

from collections import Counter

import pytest

from hardware.collectives import Collective, collective_time_s
from sim import costmodel
from sim.runner import RunOptions, simulate
from sim.training.config import parse_training
from sim.training.costs import group_links, stage_groups, stage_ranks
from sim.training.data_parallel import (
    BUCKET_PARAMETERS,
    _layer_parameter_split,
    _table_parameters_per_rank,
    closing_gradient_parameters,
    grad_sync_for_parameters,
    grad_sync_work,
    optimizer_bytes_per_parameter,
    optimizer_time_s,
    param_gather_for_parameters,
    param_gather_work,
    signature_expert_parameters,
    signature_parameter_split,
    signature_parameters,
    stage_signatures,
)
from sim.training.memory import expert_hsdp_shard, shard_degrees
from sim.training.pricing_cache import PricingCache
from tests.sim.test_training_moe_stack import QWEN3_A10
from workloads.graph import Op

EXACT = 1e-12
# Megatron-Bridge's Qwen3 30B-A3B run (published-training.md A10, tests/sim/test_training_moe_stack.py):
# TP 1, DP 8, EP 8, so every expert lives on one rank of its stage (expert_dp = 1)
# Mixtral 8x7B on 64 H100, TP 2 x PP 4 x DP 8 with EP 2: each expert on 2 x 8 / (2 x 2) = 4 ranks
MIXTRAL_EP2 = {
    "model": {"name": "mixtral-8x7b"},
    "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 64},
    "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 2, "pp": 4, "ep": 2, "zero": 1, "sequence_parallel": True, "recompute": "selective"},
}


def _with(config: dict, section: str, **values: object) -> dict:
    return {**config, section: {**config[section], **values}}


def _expert_per_rank(setup, layers: int) -> float:
    """Closed form: the routed experts of ``layers`` MoE layers on one rank (over etp x ep)."""
    model, plan = setup.model, setup.plan
    return layers * model.experts * model.mlp_parameters(model.expert_ffn_hidden) / (plan.expert_tp * plan.ep)


def test_expert_group_is_every_etp_x_ep_th_rank_of_the_stage() -> None:
    setup = parse_training(MIXTRAL_EP2)
    plan = setup.plan
    assert (plan.expert_tp, plan.expert_dp) == (2, 4)
    for stage in range(plan.pp):
        base = stage * plan.tp * plan.dp
        assert stage_groups(setup, stage)["edp"] == (base, 4, 4)
        assert stage_ranks(setup, stage).edp == (base, base + 4, base + 8, base + 12)
        assert group_links(setup, stage)["edp"].size == 4


def test_expert_parameters_split_from_the_stage_parameters() -> None:
    setup = parse_training(MIXTRAL_EP2)
    for signature in stage_signatures(setup):
        params, expert = signature_parameter_split(setup, signature)
        assert params == signature_parameters(setup, signature)
        layers = sum(chunk[1] for chunk in signature)  # Mixtral: every layer MoE
        assert expert == pytest.approx(_expert_per_rank(setup, layers), rel=EXACT)
        assert 0.0 < expert < params
    dense = parse_training(_with({**MIXTRAL_EP2, "model": {"name": "llama3-8b"}}, "parallel", ep=1))
    assert all(signature_expert_parameters(dense, s) == 0.0 for s in stage_signatures(dense))


def test_no_expert_gradients_move_when_one_rank_holds_each_expert() -> None:
    """expert_dp = 1: the stage's buckets carry its dense parameters only."""
    setup = parse_training(QWEN3_A10)
    assert setup.plan.expert_dp == 1
    for stage, signature in enumerate(stage_signatures(setup)):
        params, expert = signature_parameter_split(setup, signature)
        assert expert > 0.5 * params  # the experts are most of an MoE stage
        buckets = grad_sync_work(setup, stage, group_links(setup, stage))
        moved = sum(b.message_bytes for b in buckets)
        assert moved == pytest.approx((params - expert) * setup.grad_reduce_bytes, rel=EXACT)
        assert all(b.axis == "dp" for b in buckets)


def test_expert_buckets_reduce_over_the_expert_group_and_merge_in_fill_order() -> None:
    setup = parse_training(MIXTRAL_EP2)
    grad_bytes = setup.grad_reduce_bytes
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * setup.plan.dp)
    cache = PricingCache()
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage, cache)
        params, expert = signature_parameter_split(setup, signature)
        closing = closing_gradient_parameters(setup, signature)
        buckets = grad_sync_work(setup, stage, links, cache)
        dense = grad_sync_for_parameters(setup, params - expert, links, cache, closing)  # the dense buffer alone
        experts = Counter(buckets)
        experts.subtract(Counter(dense))
        assert min(experts.values()) >= 0  # every dense bucket is in the merged list
        expert_buckets = list(experts.elements())
        assert sum(b.message_bytes for b in expert_buckets) == pytest.approx(expert * grad_bytes, rel=EXACT)
        full = int(expert // bucket)
        full_s = collective_time_s(Collective.REDUCE_SCATTER, bucket * grad_bytes, links["edp"])
        left_s = collective_time_s(Collective.REDUCE_SCATTER, (expert - full * bucket) * grad_bytes, links["edp"])
        assert sorted(b.duration_s for b in expert_buckets) == pytest.approx(sorted([full_s] * full + [left_s]), rel=EXACT)
        assert all(b.axis == "dp" for b in buckets)  # one data-parallel stream
        if closing:
            assert buckets[-1] == dense[-1]  # the embedding's bucket closes the backward
        # fill order: the k-th full bucket of a buffer of P parameters fills at k x bucket / P of the
        # backward, a leftover at its end; dense first on ties; the closing (embedding) bucket last
        dense_params = params - expert
        opened = dense[:-1] if closing else dense
        order = sorted(
            [(min((k + 1) * bucket / dense_params, 1.0), 0, b) for k, b in enumerate(opened)]
            + [(min((k + 1) * bucket / expert, 1.0), 1, b)
               for k, b in enumerate(sorted(expert_buckets, key=lambda b: -b.message_bytes))],
            key=lambda item: item[:2],
        )
        assert buckets == tuple(b for *_, b in order) + (dense[-1:] if closing else ())


def test_zero1_optimizer_shards_the_experts_over_their_group() -> None:
    """The shard is dense / (dp x cp) + expert / expert_dp; without dp_comm_overlap the step's
    parameter all-gather gathers each part over its own group."""
    config = _with(_with(MIXTRAL_EP2, "training", grad_buffer_passes="shard"), "parallel", dp_comm_overlap=False)
    setup = parse_training(config)
    plan, gpu = setup.plan, setup.cluster.gpu
    per_param = optimizer_bytes_per_parameter("adam", "bf16")
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage)
        params = signature_parameters(setup, signature)
        expert = _expert_per_rank(setup, sum(chunk[1] for chunk in signature))
        dense = params - expert
        shard = dense / (plan.dp * plan.cp) + expert / plan.expert_dp
        step = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * per_param), gpu,
                                   precision="bf16", links=links)
        gather = (collective_time_s(Collective.ALL_GATHER, dense * 2.0, links["dp"])
                  + collective_time_s(Collective.ALL_GATHER, expert * 2.0, links["edp"]))
        assert optimizer_time_s(setup, stage, links) == pytest.approx(step + gather, rel=1e-9)


def test_zero1_paced_gathers_add_the_expert_buckets_over_their_group() -> None:
    setup = parse_training(MIXTRAL_EP2)  # megatron-core: bucket-paced ZeRO-1 gathers
    assert setup.param_gather_pacing == "bucket"
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * setup.plan.dp)
    links = group_links(setup, 1)  # no embedding or head
    (chunk,) = stage_signatures(setup)[1]
    gathers = param_gather_work(setup, 1, links)
    params = signature_parameters(setup, (chunk,))
    expert = _expert_per_rank(setup, chunk[1])
    dense = params - expert
    full, full_e = int(dense // bucket), int(expert // bucket)
    dense_s = (full * collective_time_s(Collective.ALL_GATHER, bucket * 2.0, links["dp"])
               + collective_time_s(Collective.ALL_GATHER, (dense - full * bucket) * 2.0, links["dp"]))
    expert_s = (full_e * collective_time_s(Collective.ALL_GATHER, bucket * 2.0, links["edp"])
                + collective_time_s(Collective.ALL_GATHER, (expert - full_e * bucket) * 2.0, links["edp"]))
    assert gathers.gathers[0].message_bytes == pytest.approx(params * 2.0, rel=EXACT)
    assert gathers.gathers[0].duration_s == pytest.approx(dense_s + expert_s, rel=1e-9)
    assert gathers.first_unit_s[0] == pytest.approx(
        collective_time_s(Collective.ALL_GATHER, (dense - full * bucket) * 2.0, links["dp"]), rel=EXACT)
    assert gathers.tail_share[0] == pytest.approx(1.0 / (full + 1 + full_e + 1), rel=EXACT)


def test_hsdp_shards_the_experts_inside_a_shard_group_and_replicates_them_across() -> None:
    """torchtitan's HSDP with expert parallelism: the experts are sharded over the ranks of their
    expert data-parallel group inside one dense shard group (dp_shard_mod_ep) and replicated across
    the shard groups; their gradients reduce-scatter over the first and all-reduce over the second."""
    # Mixtral, TP 2, PP 4, DP 8, EP 2 (etp 2) on 8-GPU nodes: a dense shard group is the node's 4 dp
    # ranks (8 consecutive ranks); the expert group (stride etp x ep = 4, 4 ranks) has 2 in a node
    setup = parse_training(_with(MIXTRAL_EP2, "parallel", zero=3, hsdp=True))
    plan = setup.plan
    assert shard_degrees(plan, 8) == (4, 2) and expert_hsdp_shard(plan, 4) == 2
    groups = stage_groups(setup, 0)
    assert groups["edp_shard"] == (0, 4, 2) and groups["edp_replicate"] == (0, 8, 2)
    ranks = stage_ranks(setup, 0)
    assert ranks.edp_shard == (0, 4) and ranks.edp_replicate == (0, 8)
    assert set(ranks.edp_shard) <= set(range(8))  # inside the first node, as its dense shard group
    links = group_links(setup, 1)  # no embedding or head
    (chunk,) = stage_signatures(setup)[1]
    params, expert = signature_parameter_split(setup, (chunk,))
    grad_bytes = setup.grad_reduce_bytes
    buckets = grad_sync_work(setup, 1, links)
    dense = grad_sync_for_parameters(setup, params - expert, links, None)
    extra = Counter(buckets)
    extra.subtract(Counter(dense))
    expert_buckets = list(extra.elements())
    assert sum(b.message_bytes for b in expert_buckets) == pytest.approx(expert * grad_bytes, rel=EXACT)
    shard, replicate = links["edp_shard"], links["edp_replicate"]
    for b in expert_buckets:  # reduce-scatter in the shard group, all-reduce of the shard across
        assert b.duration_s == pytest.approx(
            collective_time_s(Collective.REDUCE_SCATTER, b.message_bytes, shard)
            + collective_time_s(Collective.ALL_REDUCE, b.message_bytes / shard.size, replicate), rel=EXACT)
    # each layer unit gathers its dense part over the dense shard group and its experts over theirs
    dense_layer, expert_layer = _layer_parameter_split(setup, True)
    unit_s = (collective_time_s(Collective.ALL_GATHER, dense_layer * 2.0, links["dp_shard"])
              + collective_time_s(Collective.ALL_GATHER, expert_layer * 2.0, shard))
    gathers = param_gather_work(setup, 1, links)
    assert gathers.gathers[0].duration_s == pytest.approx(chunk[1] * unit_s, rel=1e-9)
    assert gathers.gathers[0].message_bytes == pytest.approx(params * 2.0, rel=EXACT)


def test_hsdp_memory_holds_the_experts_over_their_shard_group() -> None:
    """The memory model's expert shard under HSDP is the same group the time model gathers over."""
    setup = parse_training(_with(MIXTRAL_EP2, "parallel", zero=3, hsdp=True))
    flat = parse_training(_with(MIXTRAL_EP2, "parallel", zero=3))
    hsdp_states = simulate(_with(MIXTRAL_EP2, "parallel", zero=3, hsdp=True), RunOptions(fidelity="analytic"))
    flat_states = simulate(_with(MIXTRAL_EP2, "parallel", zero=3), RunOptions(fidelity="analytic"))
    assert setup.plan.expert_dp == flat.plan.expert_dp == 4
    # the experts, most of Mixtral, are sharded 2 ways under HSDP where they were 4: more optimizer state
    assert (hsdp_states.metrics()["memory_bytes"]["optimizer"]
            > 1.5 * flat_states.metrics()["memory_bytes"]["optimizer"])


def test_zero3_gathers_no_expert_bytes_when_one_rank_holds_each_expert() -> None:
    """expert_dp = 1: each layer unit gathers its dense part only (2 bytes a parameter) over "dp",
    the root unit (embedding / LM head) too; the experts stay where they are."""
    setup = parse_training(_with(QWEN3_A10, "parallel", zero=3))
    plan = setup.plan
    assert plan.expert_dp == 1 and setup.fsdp_unit == "layer"
    dense_layer, expert_layer = _layer_parameter_split(setup, True)
    assert expert_layer > 0.0
    ag = Collective.ALL_GATHER
    table = _table_parameters_per_rank(setup)
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage)
        gathers = param_gather_work(setup, stage, links)
        assert len(gathers.gathers) == plan.virtual_stages
        for gather, first, tail, chunk in zip(gathers.gathers, gathers.first_unit_s, gathers.tail_share, signature):
            assert chunk[0] == 0  # every Qwen3 layer is MoE
            root = table if chunk[2] else 0.0
            root += table if chunk[3] else 0.0
            layer_s = collective_time_s(ag, dense_layer * 2.0, links["dp"])
            root_s = collective_time_s(ag, root * 2.0, links["dp"]) if root else 0.0
            assert gather.message_bytes == pytest.approx((root + chunk[1] * dense_layer) * 2.0, rel=EXACT)
            assert gather.duration_s == pytest.approx(root_s + chunk[1] * layer_s, rel=1e-9)
            assert first == pytest.approx(root_s if root else layer_s, rel=EXACT)
            assert tail == pytest.approx(1.0 / chunk[1] if chunk[1] > 1 or root else 0.0, rel=EXACT)
        # no expert gradients move either: the reduce-scatters carry the dense parameters only
        params, expert = signature_parameter_split(setup, signature)
        moved = sum(b.message_bytes for b in grad_sync_work(setup, stage, links))
        assert moved == pytest.approx((params - expert) * setup.grad_reduce_bytes, rel=EXACT)


@pytest.mark.parametrize("kept", ["none", "root_last_layer"])
def test_zero3_layer_units_gather_the_experts_over_their_group(kept: str) -> None:
    """expert_dp = 4: each layer unit's all-gather is its dense part's over "dp" (8 ranks) plus its
    experts' over "edp" (4 ranks), closed form."""
    setup = parse_training(_with(_with(MIXTRAL_EP2, "parallel", zero=3), "training", fsdp_kept_after_forward=kept))
    plan = setup.plan
    assert (plan.dp, plan.expert_dp) == (8, 4)
    dense_layer, expert_layer = _layer_parameter_split(setup, True)
    ag = Collective.ALL_GATHER
    for stage in range(plan.pp):
        links = group_links(setup, stage)
        assert (links["dp"].size, links["edp"].size) == (8, 4)
        (chunk,) = stage_signatures(setup)[stage]
        unit_s = (collective_time_s(ag, dense_layer * 2.0, links["dp"])
                  + collective_time_s(ag, expert_layer * 2.0, links["edp"]))
        root = _table_parameters_per_rank(setup) * (chunk[2] + chunk[3])
        root_s = collective_time_s(ag, root * 2.0, links["dp"]) if root else 0.0
        gathers = param_gather_work(setup, stage, links)
        (gather,) = gathers.gathers
        assert gather.message_bytes == pytest.approx((root + chunk[1] * (dense_layer + expert_layer)) * 2.0, rel=EXACT)
        assert gather.duration_s == pytest.approx(root_s + chunk[1] * unit_s, rel=1e-9)
        assert gathers.first_unit_s[0] == pytest.approx(root_s if root else unit_s, rel=EXACT)
        assert gathers.tail_share[0] == pytest.approx(1.0 / chunk[1], rel=EXACT)
        if kept == "none":
            assert gathers.backward == ()
        else:  # the root kept, and the model's last layer on the last stage
            layers = chunk[1] - (1 if chunk[3] else 0)
            assert gathers.backward[0].duration_s == pytest.approx(layers * unit_s, rel=1e-9)
            assert gathers.backward_first_unit_s[0] == pytest.approx(unit_s, rel=EXACT)


def test_zero3_chunk_units_gather_each_part_over_its_group() -> None:
    setup = parse_training(_with(_with(MIXTRAL_EP2, "parallel", zero=3), "training", fsdp_unit="chunk"))
    ag = Collective.ALL_GATHER
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage)
        params, expert = signature_parameter_split(setup, signature)
        seconds = (collective_time_s(ag, (params - expert) * 2.0, links["dp"])
                   + collective_time_s(ag, expert * 2.0, links["edp"]))
        gathers = param_gather_work(setup, stage, links)
        assert gathers.gathers[0].message_bytes == pytest.approx(params * 2.0, rel=EXACT)
        assert gathers.gathers[0].duration_s == pytest.approx(seconds, rel=1e-9)
        assert gathers.first_unit_s == (gathers.gathers[0].duration_s,)


def test_zero3_reduce_scatters_and_shards_the_experts_over_their_group() -> None:
    """The gradient reduce-scatter: dense buckets over "dp", the experts' over "edp"; the optimizer
    shard dense / (dp x cp) + expert / expert_dp (as the memory model's ``shard_degrees``)."""
    config = _with(_with(MIXTRAL_EP2, "training", grad_buffer_passes="shard"), "parallel", zero=3)
    setup = parse_training(config)
    plan, gpu = setup.plan, setup.cluster.gpu
    grad_bytes = setup.grad_reduce_bytes
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * plan.dp)
    per_param = optimizer_bytes_per_parameter("adam", "bf16")
    rs = Collective.REDUCE_SCATTER
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage)
        params, expert = signature_parameter_split(setup, signature)
        closing = closing_gradient_parameters(setup, signature)
        buckets = grad_sync_work(setup, stage, links)
        dense = grad_sync_for_parameters(setup, params - expert, links, None, closing)
        experts = Counter(buckets)
        experts.subtract(Counter(dense))
        assert min(experts.values()) >= 0
        expert_buckets = list(experts.elements())
        assert sum(b.message_bytes for b in expert_buckets) == pytest.approx(expert * grad_bytes, rel=EXACT)
        full = int(expert // bucket)
        expected = [collective_time_s(rs, bucket * grad_bytes, links["edp"])] * full + [
            collective_time_s(rs, (expert - full * bucket) * grad_bytes, links["edp"])]
        assert sorted(b.duration_s for b in expert_buckets) == pytest.approx(sorted(expected), rel=EXACT)
        assert all(b.kind == "reduce_scatter" for b in buckets)
        if closing:
            assert buckets[-1] == dense[-1]  # the root unit (embedding) reduce-scatters last
        shard = (params - expert) / (plan.dp * plan.cp) + expert / plan.expert_dp
        step = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * per_param), gpu,
                                   precision="bf16", links=links)
        assert optimizer_time_s(setup, stage, links) == pytest.approx(step, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_both_fidelities_agree_on_an_moe_plan(zero: int) -> None:
    config = _with(MIXTRAL_EP2, "parallel", zero=zero)
    des = simulate(config, RunOptions(fidelity="des")).metrics()
    analytic = simulate(config, RunOptions(fidelity="analytic")).metrics()
    assert des["iteration_time_s"] == pytest.approx(analytic["iteration_time_s"], rel=0.03)
    assert des["exposed_communication_s"]["dp"] > 0.0


@pytest.mark.parametrize("config", [
    _with(_with(QWEN3_A10, "parallel", zero=3, schedule="1f1b", virtual_stages=1), "training", framework="torchtitan"),
    _with(_with(MIXTRAL_EP2, "parallel", pp=1, ep=4, zero=3, recompute="full"), "training", global_batch=32),
], ids=["qwen3-edp1", "mixtral-edp8"])
def test_both_fidelities_agree_on_small_moe_zero3_plans(config: dict) -> None:
    des = simulate(config, RunOptions(fidelity="des")).metrics()
    analytic = simulate(config, RunOptions(fidelity="analytic")).metrics()
    assert des["iteration_time_s"] == pytest.approx(analytic["iteration_time_s"], rel=0.03)
