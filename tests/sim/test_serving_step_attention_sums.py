"""The serving step cost prices a step's attention from sums over its chunks
(``StepCostModel.chunks_attention_time_s``), not from a list of (query, key) pairs: it must give the
same float as ``attention_time_s`` on the pairs, and ``step_time_s`` the same float as
``batch_time_s`` on the pairs, for every kernel rule, calibrated or analytic GPUs, speculative
decoding, sliding windows and expert parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from hardware import cost as hw
from hardware.catalog import get_gpu, get_network, get_node
from hardware.topology import build_cluster
from sim.serving.plan import Chunk, StepPlan
from sim.serving.request import SimRequest
from sim.serving.stepcost import ReplicaShape, StepCostModel
from workloads.catalog import get_model


def _cost(model: str, *, gpu: str, tp: int = 1, ep: int = 1, decode_attention: str = "shared_kv",
          cuda_graph_padding: str = "none") -> StepCostModel:
    spec = get_gpu(gpu)
    node = get_node(spec.default_node)
    cluster = build_cluster(spec, node, get_network(node.default_network), tp * ep)
    shape = ReplicaShape(model=get_model(model), cluster=cluster, tp=tp, ep=ep)
    return StepCostModel(shape, step_overhead_s=1e-3, request_overhead_s=1e-5, decode_attention=decode_attention,
                         draft_free_overhead=0.25, cuda_graph_padding=cuda_graph_padding)


def _random_plan(rng: np.random.Generator, *, speculative: bool) -> StepPlan:
    """Decodes (1 query token, or 1 + drafts), prompt chunks (1 token too, sometimes), in random order."""
    chunks = []
    for i in range(int(rng.integers(1, 300))):
        request = SimRequest(i, 0.0, int(rng.integers(1, 9000)), 64)
        kind = rng.random()
        context = int(rng.integers(0, 20000))
        if kind < 0.8:
            query = 1 + (int(rng.integers(0, 5)) if speculative else 0)
            chunks.append(Chunk(request, query, context, True))
        else:
            query = 1 if kind < 0.85 else int(rng.integers(1, 4096))
            chunks.append(Chunk(request, query, context, False))
    return StepPlan(chunks=tuple(chunks))


def _reference_step_s(cost: StepCostModel, plan: StepPlan) -> float:
    """``step_time_s`` as the per-chunk loop over (query, key) pairs defines it."""
    sequences, sampled, drafts = [], 0, 0
    for c in plan.chunks:
        q = c.query_tokens
        sequences.append((q, c.context_tokens + q))
        if c.is_decode:
            sampled += q
            drafts = max(drafts, q - 1)
        else:
            sampled += 1
    contexts = [c.context_tokens for c in plan.chunks if c.is_decode] if drafts else []
    tokens = plan.num_tokens
    if cost.cuda_graph_padding != "none" and plan.num_prefill_tokens == 0 and tokens == len(plan.chunks):
        from sim.serving.stepcost import cuda_graph_batch

        tokens = cuda_graph_batch(cost.cuda_graph_padding, tokens, max(kv for _, kv in sequences)) or tokens
    return cost.batch_time_s(tokens, sequences, sampled, drafts=drafts, decode_contexts=contexts)


@pytest.mark.parametrize("model, gpu, tp, ep, kernel", [
    ("llama3-8b", "h100-sxm-80gb", 1, 1, "per_query_head"),  # calibrated GPU, GQA through one block per head
    ("llama3-70b", "h100-sxm-80gb", 8, 1, "shared_kv"),
    ("llama2-7b", "a100-sxm-80gb", 1, 1, "per_query_head"),
    ("mistral-7b", "a100-sxm-80gb", 1, 1, "shared_kv"),  # sliding window: the per-pair path
    ("mixtral-8x7b", "h100-sxm-80gb", 1, 2, "shared_kv"),  # expert parallelism: the per-pair path
])
def test_step_attention_from_sums_is_bit_identical(model: str, gpu: str, tp: int, ep: int, kernel: str) -> None:
    cost = _cost(model, gpu=gpu, tp=tp, ep=ep, decode_attention=kernel)
    rng = np.random.default_rng(7)
    for trial in range(60):
        plan = _random_plan(rng, speculative=trial % 2 == 1)
        pairs = [(c.query_tokens, c.context_tokens + c.query_tokens) for c in plan.chunks]
        assert cost.chunks_attention_time_s(plan.chunks) == cost.attention_time_s(pairs)
        assert cost.step_time_s(plan) == _reference_step_s(cost, plan)
    assert cost.chunks_attention_time_s(()) == 0.0


def test_decode_only_step_under_cuda_graph_padding_is_bit_identical() -> None:
    cost = _cost("llama3-8b", gpu="a100-sxm-80gb", cuda_graph_padding="vllm-v0")
    rng = np.random.default_rng(3)
    for n in (1, 3, 5, 17, 256, 300):
        plan = StepPlan(chunks=tuple(Chunk(SimRequest(i, 0.0, 100, 10), 1, int(rng.integers(100, 9000)), True)
                                     for i in range(n)))
        assert cost.step_time_s(plan) == _reference_step_s(cost, plan)


def test_single_query_sum_is_the_per_sequence_sum() -> None:
    keys = [1, 2, 129, 4096, 77777]
    for causal in (True, False):
        assert hw.single_query_keys_processed(len(keys), sum(keys), causal=causal) == sum(
            hw.attention_keys_processed(1, kv, causal=causal) for kv in keys)
    assert hw.single_query_keys_processed(2, 10) == 11.0  # kv + 1/2 each: 10 + 2 x 1/2
