"""Schedulers called directly (no SimPy): budgets, chunked prefill, preemption, orderings."""

from __future__ import annotations

from sim.serving.batching import InflightScheduler, OrcaScheduler, StaticScheduler
from sim.serving.kv_cache import BlockManager
from sim.serving.request import SimRequest, Status
from sim.serving.schedulers import BatchLimits, VllmScheduler


def _req(i: int, prompt: int, output: int, arrival: float = 0.0) -> SimRequest:
    return SimRequest(i, arrival, prompt, output)


def _shape(plan) -> list[tuple[int, int, bool]]:  # type: ignore[no-untyped-def]
    return [(c.request.request_id, c.query_tokens, c.is_decode) for c in plan.chunks]


def test_vllm_token_budget_and_chunked_prefill() -> None:
    s = VllmScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=10), BlockManager(100, 4))
    s.add(_req(0, 16, 3), 0.0)
    s.add(_req(1, 4, 2), 0.0)
    plan = s.schedule(0.0)
    assert _shape(plan) == [(0, 10, False)]  # the budget cuts request 0's prompt into a chunk
    s.complete(plan, 1.0)
    plan = s.schedule(1.0)
    assert _shape(plan) == [(0, 6, False), (1, 4, False)]  # running first, then the waiting one
    assert [c.context_tokens for c in plan.chunks] == [10, 0]
    s.complete(plan, 2.0)
    assert s.running[0].first_token_s == 2.0 and s.running[1].first_token_s == 2.0
    plan = s.schedule(2.0)
    assert _shape(plan) == [(0, 1, True), (1, 1, True)]
    done = s.complete(plan, 3.0)
    assert [r.request_id for r in done] == [1]  # two tokens: prefill's + one decode
    assert done[0].finish_s == 3.0 and done[0].status == Status.FINISHED


def test_vllm_v0_mode_runs_prefills_alone() -> None:
    s = VllmScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=64, chunked_prefill=False), BlockManager(100, 4))
    s.add(_req(0, 8, 5), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    s.add(_req(1, 8, 5), 1.0)
    plan = s.schedule(1.0)
    assert _shape(plan) == [(1, 8, False)]  # the decode of request 0 stalls behind the prefill
    s.complete(plan, 2.0)
    assert _shape(s.schedule(2.0)) == [(0, 1, True), (1, 1, True)]


def test_recompute_preemption_takes_the_newest_request() -> None:
    # 4 blocks of 4 tokens; two requests of 8-token prompts fill them, the next decode needs a fifth
    blocks = BlockManager(4, 4)
    s = VllmScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=64), blocks)
    s.watermark_blocks = 0
    s.add(_req(0, 8, 4), 0.0)
    s.add(_req(1, 8, 4), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    assert blocks.available == 0
    plan = s.schedule(1.0)
    assert [r.request_id for r in plan.preempted] == [1]
    assert _shape(plan) == [(0, 1, True)]
    victim = plan.preempted[0]
    assert victim.computed == 0 and victim.preemptions == 1 and s.waiting[0] is victim
    assert victim.generated == 1  # its emitted token stays emitted; recompute covers prompt + it
    assert victim.remaining_tokens == 9
    blocks.check()


def test_swap_preemption_moves_blocks_and_back() -> None:
    blocks = BlockManager(4, 4)
    limits = BatchLimits(max_num_seqs=8, max_batched_tokens=64, preemption_mode="swap", swap_capacity_blocks=10)
    s = VllmScheduler(limits, blocks)
    s.watermark_blocks = 0
    s.add(_req(0, 8, 2), 0.0)
    s.add(_req(1, 8, 4), 0.0)
    s.complete(s.schedule(0.0), 1.0)
    plan = s.schedule(1.0)
    assert plan.swapped_out_blocks == 2 and plan.swapped_in_blocks == 0
    assert s.swapped[0].request_id == 1 and s.swapped[0].computed == 8
    s.complete(plan, 2.0)  # request 0 finishes and frees its 3 blocks
    plan = s.schedule(2.0)
    assert plan.swapped_in_blocks == 2 and _shape(plan) == [(1, 1, True)]


def test_sarathi_schedules_decodes_first_then_chunks() -> None:
    limits = BatchLimits(max_num_seqs=8, max_batched_tokens=6, decode_first=True)
    s = VllmScheduler(limits, BlockManager(100, 4))
    s.add(_req(0, 20, 5), 0.0)
    s.add(_req(1, 2, 5), 0.0)
    plan = s.schedule(0.0)
    assert _shape(plan) == [(0, 6, False)]
    s.complete(plan, 1.0)
    plan = s.schedule(1.0)
    assert _shape(plan) == [(0, 6, False)]  # still prefilling: request 1 waits for budget
    s.complete(plan, 2.0)
    s.complete(s.schedule(2.0), 3.0)
    plan = s.schedule(3.0)  # request 0 has 2 prompt tokens left and request 1 joined
    s.complete(plan, 4.0)
    plan = s.schedule(4.0)
    assert plan.chunks[0].is_decode  # decodes lead the batch


def test_orca_reserves_maximum_length_up_front() -> None:
    blocks = BlockManager(10, 4)
    s = OrcaScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=64), blocks, reserve_tokens=20)
    for i in range(3):
        s.add(_req(i, 4, 2), 0.0)
    plan = s.schedule(0.0)
    assert _shape(plan) == [(0, 4, False), (1, 4, False)]  # 5 blocks each: the third must wait
    assert blocks.available == 0


def test_inflight_generation_first_then_fcfs_context_chunks_in_whole_blocks() -> None:
    # TensorRT-LLM's in-flight batcher: GUARANTEED_NO_EVICT reserves prompt + output up front; each
    # step takes every generating request's token, then context chunks in the rest of the budget,
    # first come first served, a cut chunk rounded down to whole KV blocks (4 tokens here)
    blocks = BlockManager(9, 4)
    s = InflightScheduler(BatchLimits(max_num_seqs=3, max_batched_tokens=10), blocks, reserve_tokens=0)
    s.add(_req(0, 6, 2), 0.0)  # 8 tokens: 2 blocks
    s.add(_req(1, 13, 3), 0.0)  # 16 tokens: 4 blocks
    s.add(_req(2, 5, 3), 0.0)  # 8 tokens: 2 blocks
    s.add(_req(3, 4, 1), 0.0)  # would fit the blocks left (1 block), but max_num_seqs = 3 holds it
    plan = s.schedule(0.0)
    # request 0 whole (6), then request 1 cut from 13 to the 4 budget tokens left, in whole blocks
    assert _shape(plan) == [(0, 6, False), (1, 4, False)]
    assert blocks.available == 1 and len(s.running) == 3  # all three reserved their whole length
    s.complete(plan, 1.0)
    plan = s.schedule(1.0)
    # the generating request first, then request 1's remaining 9 tokens fill the budget; request 2 waits
    assert _shape(plan) == [(0, 1, True), (1, 9, False)]
    assert [c.context_tokens for c in plan.chunks] == [6, 4]
    done = s.complete(plan, 2.0)
    assert [r.request_id for r in done] == [0]  # prefill's token + one decode = its 2 outputs
    plan = s.schedule(2.0)
    # request 0's slot and blocks are free: request 3 is admitted behind request 2
    assert _shape(plan) == [(1, 1, True), (2, 5, False), (3, 4, False)]
    assert s.num_preemptions == 0


def test_inflight_without_context_chunking_a_prompt_waits_to_fit_whole() -> None:
    s = InflightScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=8, chunked_prefill=False),
                          BlockManager(100, 4), reserve_tokens=0)
    s.add(_req(0, 6, 3), 0.0)
    s.add(_req(1, 7, 2), 0.0)
    plan = s.schedule(0.0)
    assert _shape(plan) == [(0, 6, False)]  # request 1's 7 tokens do not fit the 2 left: no chunk
    s.complete(plan, 1.0)
    assert _shape(s.schedule(1.0)) == [(0, 1, True), (1, 7, False)]


def test_inflight_rejects_a_prompt_no_step_can_hold() -> None:
    # without chunking a prompt longer than the token budget could never run; with chunking a budget
    # below one KV block could never cut a chunk: each is a reason, so the request is rejected
    unchunked = InflightScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=8, chunked_prefill=False),
                                  BlockManager(100, 4), reserve_tokens=0)
    assert "without chunked_prefill" in unchunked.can_ever_fit(_req(0, 9, 1))
    assert unchunked.can_ever_fit(_req(1, 8, 1)) == ""
    tiny = InflightScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=3), BlockManager(100, 4), reserve_tokens=0)
    assert "whole KV blocks of 4 tokens" in tiny.can_ever_fit(_req(2, 9, 1))
    chunked = InflightScheduler(BatchLimits(max_num_seqs=8, max_batched_tokens=8), BlockManager(100, 4), reserve_tokens=0)
    assert chunked.can_ever_fit(_req(3, 9, 1)) == ""


def test_static_batch_runs_to_completion_with_padding() -> None:
    blocks = BlockManager(100, 4)
    s = StaticScheduler(BatchLimits(max_num_seqs=2, max_batched_tokens=64), blocks)
    s.add(_req(0, 4, 1), 0.0)
    s.add(_req(1, 4, 3), 0.0)
    s.add(_req(2, 4, 1), 0.0)
    plan = s.schedule(0.0)
    assert _shape(plan) == [(0, 4, False), (1, 4, False)]
    assert [r.request_id for r in s.complete(plan, 1.0)] == [0]
    plan = s.schedule(1.0)
    assert [c.emits for c in plan.chunks] == [False, True]  # the finished member is padding
    s.complete(plan, 2.0)
    s.complete(s.schedule(2.0), 3.0)
    assert not s.batch and blocks.available == 100
    assert _shape(s.schedule(3.0)) == [(2, 4, False)]
