"""Per-op selective checkpointing (torchtitan's policy at 9dec370) on a layer's forward op graph:
which outputs are kept, which matmuls and ops are re-run."""

from __future__ import annotations

import pytest

from workloads.checkpointing import output_bytes, per_op_checkpoint, torch_matmuls
from workloads.graph import Sharding, layer_forward_ops
from workloads.model import ModelSpec

# tiny Llama-style block: h 64, 4 heads of 16, 2 KV heads, SwiGLU f 128
LLAMA = dict(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256,
             activation="swiglu", norm="rmsnorm", position="rope", max_seq_len=32)
T = 64  # tokens of one micro-batch (2 sequences of 32)
A = 2.0  # 16-bit activations


def _forward(model: ModelSpec, sharding: Sharding = Sharding(), fused: bool = True):  # type: ignore[no-untyped-def]
    return layer_forward_ops(model, tokens=T, sequences=((32, 32),) * 2, sharding=sharding, moe=False,
                             bytes_per_element=A, fused_attention=fused)


def test_llama_block_keeps_wq_wv_w1_w2_and_the_attention_and_reruns_wk_wo_w3() -> None:
    model = ModelSpec(**LLAMA)
    policy = per_op_checkpoint(_forward(model), model=model, tp=1)
    assert [name for name, _ in policy.saved] == ["qkv_proj_wq", "qkv_proj_wv", "attention", "mlp_up_w1", "mlp_down"]
    # every op outside the save list and the 2nd, 4th, 6th matmul (wk, wo, w3), up to the last matmul
    assert [op.name for op in policy.recompute] == [
        "input_norm", "qkv_proj_wk", "rope", "out_proj", "residual_norm", "mlp_up_w3", "mlp_activation"]
    h, kv, f, heads = 64, 2 * 16, 128, 4
    # bytes kept: T x (h | kv | h + fp32 LSE per head | f | h)
    assert dict(policy.saved) == {
        "qkv_proj_wq": A * T * h, "qkv_proj_wv": A * T * kv, "attention": A * T * h + 4.0 * heads * T,
        "mlp_up_w1": A * T * f, "mlp_down": A * T * h,
    }
    assert policy.saved_bytes == A * T * (3 * h + kv + f) + 4.0 * heads * T == 54272 - A * T * h
    # recomputed matmul FLOPs: wk 2 T h kv + wo 2 T h h + w3 2 T h f
    assert sum(op.gemm_flops for op in policy.recompute) == 2 * T * h * (kv + h + f) == 1_835_008


def test_a_gelu_block_reruns_its_last_matmul_and_stops_there() -> None:
    """GeLU: wq, wk, wv, wo, fc1, fc2 = six matmuls; fc2 is the 6th (re-run), so the recomputation
    ends with it and the residual add after it is not re-run (early stop)."""
    model = ModelSpec(**dict(LLAMA, activation="gelu", norm="layernorm"))
    policy = per_op_checkpoint(_forward(model), model=model, tp=1)
    assert [name for name, _ in policy.saved] == ["qkv_proj_wq", "qkv_proj_wv", "attention", "mlp_up"]
    assert [op.name for op in policy.recompute][-3:] == ["residual_norm", "mlp_activation", "mlp_down"]
    assert "residual" not in [op.name for op in policy.recompute]


def test_tensor_parallel_shards_and_the_saved_reduce_scatters() -> None:
    """tp 2 with sequence parallelism: column-parallel outputs are split, the row-parallel w2
    output is the unreduced T x h partial sum, each reduce-scatter keeps its T/t x h shard; the
    all-gathers are re-run."""
    model = ModelSpec(**LLAMA)
    t = 2
    policy = per_op_checkpoint(_forward(model, Sharding(tp=t, sequence_parallel=True)), model=model, tp=t)
    h, kv, f, heads = 64, 2 * 16, 128, 4
    assert dict(policy.saved) == {
        "qkv_proj_wq": A * T * h / t, "qkv_proj_wv": A * T * kv / t, "attention": (A * T * h + 4.0 * heads * T) / t,
        "attention_reduce_scatter": A * T * h / t, "mlp_up_w1": A * T * f / t, "mlp_down": A * T * h,
        "mlp_reduce_scatter": A * T * h / t,
    }
    rerun = [op.name for op in policy.recompute]
    assert "attention_all_gather" in rerun and "mlp_all_gather" in rerun


def test_unfused_attention_is_bmm_and_recomputed() -> None:
    model = ModelSpec(**LLAMA)
    policy = per_op_checkpoint(_forward(model, fused=False), model=model, tp=1)
    assert [name for name, _ in policy.saved] == ["qkv_proj_wq", "qkv_proj_wv", "mlp_up_w1", "mlp_down"]
    rerun = [op.name for op in policy.recompute]
    assert {"attention_scores", "attention_softmax", "attention_values", "out_proj"} <= set(rerun)


def test_matmul_split_keeps_the_shapes() -> None:
    model = ModelSpec(**LLAMA)
    ops = {op.name: op for op in _forward(model)}
    q, k, v = torch_matmuls(ops["qkv_proj"], model, 1)
    assert (q.n, k.n, v.n) == (64, 32, 32) and q.m == k.m == v.m == T and q.k == 64
    w1, w3 = torch_matmuls(ops["mlp_up"], model, 1)
    assert (w1.n, w3.n) == (128, 128)
    assert torch_matmuls(ops["out_proj"], model, 1) == (ops["out_proj"],)
    with pytest.raises(ValueError, match="not in the per-op save list"):
        output_bytes(ops["rope"], 1)
