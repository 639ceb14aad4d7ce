"""Serving stack setting ``tp_logits``: TensorRT-LLM gathers the vocab-parallel logits onto every
tensor-parallel rank (its LM head is ColumnLinear(..., gather_output=True)) and every rank's decoder
samples the full vocabulary; other stacks are priced with each rank sampling its own shard."""

from __future__ import annotations

import pytest

from hardware.catalog import get_gpu, get_network, get_node
from hardware.topology import build_cluster
from sim.costmodel import price_ops
from sim.serving.capacity import workspace_bytes_per_gpu
from sim.serving.config import parse_serving
from sim.serving.stepcost import LOGIT_BYTES, SAMPLER_PASSES, ReplicaShape, StepCostModel
from sim.stacks import get_stack
from workloads.catalog import get_model
from workloads.graph import Op, Sharding, lm_head_ops

from tests.test_cli_bad_input import serving_error


def _shape(tp: int) -> ReplicaShape:
    gpu = get_gpu("h100-sxm-80gb")
    node = get_node(gpu.default_node)
    cluster = build_cluster(gpu, node, get_network(node.default_network), tp)
    return ReplicaShape(model=get_model("llama3-70b"), cluster=cluster, tp=tp, weight_precision="fp16",
                        kv_precision="fp16", activation_precision="fp16")


def _cost(tp: int, tp_logits: str) -> StepCostModel:
    return StepCostModel(_shape(tp), step_overhead_s=0.0, request_overhead_s=0.0, tp_all_reduce="trtllm",
                         tp_logits=tp_logits)


def test_gathered_logits_add_an_all_gather_and_a_full_vocabulary_sampler() -> None:
    # llama3-70b on 8 H100, 6 sampled positions: vocab 128,256 = 8 x 16,032 (already a multiple of 8)
    sampled, tp = 6, 8
    gathered, shard = _cost(tp, "all_gather"), _cost(tp, "shard")
    model = get_model("llama3-70b")
    head = lm_head_ops(model, tokens=sampled, sharding=Sharding(tp=tp), bytes_per_element=2.0,
                       weight_bytes_per_element=2.0, loss=False)
    vocab = 16_032 * tp
    expected_ops = [*head,
                    Op(name="logits_all_gather", kind="collective", collective="all_gather", axis="tp",
                       message_bytes=sampled * vocab * 2.0),
                    Op(name="sampler", kind="memory", bytes_moved=SAMPLER_PASSES * sampled * vocab * LOGIT_BYTES)]
    expected = price_ops(expected_ops, gathered._gpu, precision="fp16", links=gathered._links).total_s
    assert gathered.head_time_s(sampled) == pytest.approx(expected, rel=1e-12)
    shard_ops = [*head, Op(name="sampler", kind="memory", bytes_moved=SAMPLER_PASSES * sampled * 16_032 * LOGIT_BYTES)]
    assert shard.head_time_s(sampled) == pytest.approx(
        price_ops(shard_ops, shard._gpu, precision="fp16", links=shard._links).total_s, rel=1e-12)
    assert gathered.head_time_s(sampled) > shard.head_time_s(sampled)


def test_gathered_logits_change_nothing_on_one_gpu() -> None:
    assert _cost(1, "all_gather").head_time_s(300) == _cost(1, "shard").head_time_s(300)
    assert workspace_bytes_per_gpu(_shape(1), 2048, 256, gathered_logits=True) == workspace_bytes_per_gpu(_shape(1), 2048, 256)


def test_gathered_logits_buffer_holds_the_full_vocabulary_on_every_rank() -> None:
    # the fp32 logits buffer of 896 sequences: 896 x 128,256 x 4 B per GPU gathered, an eighth of it sharded
    shape = _shape(8)
    extra = workspace_bytes_per_gpu(shape, 2048, 896, gathered_logits=True) - workspace_bytes_per_gpu(shape, 2048, 896)
    assert extra == 896 * 16_032 * 7 * LOGIT_BYTES


def test_tp_logits_comes_from_the_stack_and_a_user_key_wins(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert get_stack("serving", "trtllm").settings["tp_logits"] == "all_gather"
    assert get_stack("serving", "trtllm-0.9").settings["tp_logits"] == "all_gather"
    for name in ("vllm", "vllm-0.5", "fastertransformer"):
        assert get_stack("serving", name).settings["tp_logits"] == "shard"
    assert parse_serving({"framework": "trtllm"}).tp_logits == "all_gather"
    assert parse_serving({"framework": "trtllm", "tp_logits": "shard"}).tp_logits == "shard"
    assert parse_serving({}).tp_logits == "shard"
    with pytest.raises(ValueError, match="tp_logits"):
        _cost(2, "gather")
    err = serving_error(capsys, tmp_path, 'framework = "trtllm"\ntp = 2\ntp_logits = "gather"', num_gpus=2)
    assert "tp_logits" in err and "all_gather" in err


# ---- TensorRT-LLM's AllReduce plugin: its kernel within the workspace, one kernel launch per call --------
def test_trtllm_all_reduce_workspace_follows_the_plugin() -> None:
    from sim.serving.stepcost import trtllm_all_reduce_workspace_bytes

    assert [trtllm_all_reduce_workspace_bytes(r) for r in (2, 4, 8)] == [16e6, 8e6, 8e6]


def test_kernel_launched_all_reduce_pays_the_gpu_launch_within_the_workspace_and_nccl_past_it() -> None:
    from hardware.collectives import COLLECTIVE_LAUNCH_OVERHEAD_S, collective_time_s
    from hardware.cost import launch_overhead_s

    cost = StepCostModel(_shape(4), step_overhead_s=0.0, request_overhead_s=0.0, tp_all_reduce="trtllm",
                         custom_all_reduce_launch="kernel")
    links = cost._links["tp"]
    profile = get_gpu("h100-sxm-80gb").calibration.profile
    trt, nccl = profile.custom_all_reduce[("trtllm", 4)], profile.collectives[("all_reduce", 4)]
    launch = launch_overhead_s(get_gpu("h100-sxm-80gb"))
    assert (links.kernel_all_reduce_max_bytes, links.kernel_launch_s) == (8e6, launch)
    # within the 8,000,000 B workspace: the plugin's measured kernel + one launch; past it NCCL + its overhead
    assert collective_time_s("all_reduce", 7e6, links) == pytest.approx(trt.at(7e6) + launch, rel=1e-12)
    assert collective_time_s("all_reduce", 9e6, links) == pytest.approx(nccl.at(9e6) + COLLECTIVE_LAUNCH_OVERHEAD_S, rel=1e-12)
    # other collectives keep the framework overhead
    gather = profile.collectives[("all_gather", 4)]
    assert collective_time_s("all_gather", 1e6, links) == pytest.approx(gather.at(1e6) + COLLECTIVE_LAUNCH_OVERHEAD_S, rel=1e-12)
    # "collective" launch: every call pays the NCCL overhead, the plugin's kernel still serves within the workspace
    plain = StepCostModel(_shape(4), step_overhead_s=0.0, request_overhead_s=0.0, tp_all_reduce="trtllm")._links["tp"]
    assert collective_time_s("all_reduce", 7e6, plain) == pytest.approx(trt.at(7e6) + COLLECTIVE_LAUNCH_OVERHEAD_S, rel=1e-12)
    with pytest.raises(ValueError, match="custom_all_reduce_launch"):
        StepCostModel(_shape(4), step_overhead_s=0.0, request_overhead_s=0.0, custom_all_reduce_launch="graph")


def test_custom_all_reduce_launch_comes_from_the_stack() -> None:
    assert [get_stack("serving", n).settings["custom_all_reduce_launch"] for n in ("trtllm", "trtllm-0.9")] == ["kernel"] * 2
    for name in ("vllm", "vllm-0.5", "fastertransformer"):
        assert get_stack("serving", name).settings["custom_all_reduce_launch"] == "collective"
    assert parse_serving({"framework": "trtllm"}).custom_all_reduce_launch == "kernel"
    assert parse_serving({"framework": "trtllm", "custom_all_reduce_launch": "collective"}).custom_all_reduce_launch == "collective"
