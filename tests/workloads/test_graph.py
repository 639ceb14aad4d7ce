"""Layer op graphs: shapes, FLOPs against the closed forms, sharding and the backward split."""

from __future__ import annotations

import networkx as nx
import pytest

from workloads.catalog import get_model
from workloads.graph import (
    Sharding,
    backward_ops,
    expected_active_experts,
    layer_forward_ops,
    lm_head_ops,
    op_graph,
)


def _gemm_flops(ops) -> float:  # type: ignore[no-untyped-def]
    return sum(op.gemm_flops for op in ops)


def test_dense_layer_gemm_flops_match_megatron() -> None:
    """GPT layer forward GEMMs: 24 b s h^2 / t (QKV 6, out 2, MLP 16) per rank (Narayanan 2021)."""
    model = get_model("gpt3-175b")
    s, h, t = 2048, model.hidden, 8
    ops = layer_forward_ops(model, tokens=s, sequences=[(s, s)], sharding=Sharding(tp=t), moe=False, bytes_per_element=2)
    assert _gemm_flops(ops) == pytest.approx(24 * s * h**2 / t, rel=1e-12)


def test_unfused_attention_counts_the_full_score_matrix() -> None:
    model = get_model("gpt3-175b")
    s, h = 2048, model.hidden
    ops = layer_forward_ops(model, tokens=s, sequences=[(s, s)], sharding=Sharding(), moe=False, bytes_per_element=2, fused_attention=False)
    scores = [op for op in ops if op.name.startswith("attention_")]
    assert _gemm_flops(scores) == pytest.approx(4 * s * s * h, rel=1e-12)  # QK^T and AV, 2 s^2 h each


def test_backward_splits_input_and_weight_gradients() -> None:
    model = get_model("llama3-8b")
    ops = layer_forward_ops(model, tokens=4096, sequences=[(4096, 4096)], sharding=Sharding(tp=2), moe=False, bytes_per_element=2)
    b_ops, w_ops = backward_ops(ops)
    # dX and dW each cost as much as the forward GEMM
    assert _gemm_flops(b_ops) == pytest.approx(_gemm_flops(ops), rel=1e-12)
    assert _gemm_flops(w_ops) == pytest.approx(_gemm_flops(ops), rel=1e-12)
    assert all(op.kind == "gemm" for op in w_ops)


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter() -> None:
    model = get_model("llama3-8b")
    kwargs = dict(tokens=4096, sequences=[(4096, 4096)], moe=False, bytes_per_element=2)
    tp_only = {op.collective for op in layer_forward_ops(model, sharding=Sharding(tp=4), **kwargs) if op.kind == "collective"}
    with_sp = {op.collective for op in layer_forward_ops(model, sharding=Sharding(tp=4, sequence_parallel=True), **kwargs) if op.kind == "collective"}
    assert tp_only == {"all_reduce"} and with_sp == {"all_gather", "reduce_scatter"}
    assert not [op for op in layer_forward_ops(model, sharding=Sharding(tp=1), **kwargs) if op.kind == "collective"]


def test_sequence_parallel_backward_gathers_the_weight_gradient_input_again() -> None:
    # the forward all-gathers (QKV and fc1 inputs) are stored sharded: backward gathers each again
    # right before the input-gradient GEMM that it overlaps, for the weight gradient
    model = get_model("llama3-8b")
    kwargs = dict(tokens=4096, sequences=[(4096, 4096)], moe=False, bytes_per_element=2)
    forward = layer_forward_ops(model, sharding=Sharding(tp=4, sequence_parallel=True), **kwargs)
    b_ops, _ = backward_ops(forward)
    names = [op.name for op in b_ops]
    regathers = [op for op in b_ops if op.name.endswith("_regather")]
    assert [op.name for op in regathers] == ["mlp_all_gather_regather", "attention_all_gather_regather"]
    for op in regathers:
        gathered = next(f for f in forward if f.name == op.name.removesuffix("_regather"))
        assert op.collective == "all_gather" and op.message_bytes == gathered.message_bytes
    assert names[names.index("mlp_all_gather_regather") + 1] == "mlp_up_dgrad"
    assert names[names.index("attention_all_gather_regather") + 1] == "qkv_proj_dgrad"
    plain, _ = backward_ops(layer_forward_ops(model, sharding=Sharding(tp=4), **kwargs))
    assert not [op for op in plain if op.name.endswith("_regather")]


def test_moe_layer_routes_top_k_and_dispatches_over_ep() -> None:
    model = get_model("mixtral-8x7b")
    ops = layer_forward_ops(model, tokens=4096, sequences=[(4096, 4096)], sharding=Sharding(ep=8), moe=True, bytes_per_element=2)
    names = [op.name for op in ops]
    assert "ep_dispatch" in names and "ep_combine" in names
    experts_up = next(op for op in ops if op.name == "experts_up")
    # 8 ranks x 4096 tokens x top-2 spread over 8 experts, one expert per rank
    assert experts_up.batch == 1 and experts_up.m == 4096 * 2


def test_expected_active_experts() -> None:
    assert expected_active_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_active_experts(8, 2, 1000) == pytest.approx(8.0)
    assert expected_active_experts(256, 8, 0) == 0.0


def test_cross_entropy_backward_has_its_own_traffic() -> None:
    model = get_model("llama3-8b")
    ops = lm_head_ops(model, tokens=1024, sharding=Sharding(), bytes_per_element=2)
    b_ops, _ = backward_ops(ops)
    forward = next(op for op in ops if op.name == "cross_entropy")
    backward = next(op for op in b_ops if op.name == "cross_entropy_backward")
    assert forward.bytes_moved == 38 * 1024 * model.vocab and backward.bytes_moved == 14 * 1024 * model.vocab


def test_op_graph_is_a_dependency_chain() -> None:
    model = get_model("llama3-8b")
    ops = layer_forward_ops(model, tokens=128, sequences=[(128, 128)], sharding=Sharding(), moe=False, bytes_per_element=2)
    graph = op_graph(ops)
    assert list(nx.topological_sort(graph)) == [op.name for op in ops]
    assert nx.is_directed_acyclic_graph(graph) and graph.number_of_edges() == len(ops) - 1


def test_unfused_softmax_moves_9_bytes_a_score_forward_and_11_backward() -> None:
    """Megatron's fused scale-mask-softmax + dropout: forward 2 + 2 (softmax) + 2 + 2 + 1 (dropout,
    1-byte mask); backward 2 + 1 + 2 (dropout) + 2 + 2 + 2 (softmax backward, in place)."""
    from workloads.graph import backward_ops, unfused_attention_ops

    ops = unfused_attention_ops([(2048, 2048), (2048, 2048)], heads=8, qk_dim=128, v_dim=128, bytes_per_element=2)
    scores = 2 * 8 * 2048 * 2048
    softmax = next(op for op in ops if op.name == "attention_softmax")
    assert softmax.bytes_moved == 9 * scores
    backward = next(op for op in backward_ops([softmax])[0] if op.name == "attention_softmax_backward")
    assert backward.bytes_moved == 11 * scores
