"""The two pre-PagedAttention batching baselines, with the same interface as ``VllmScheduler``.

- ``OrcaScheduler`` (Yu et al., OSDI'22): iteration-level batching. Every step runs one decode token
  of each running request plus whole prompts of newly admitted ones (token budget
  ``max_batched_tokens``); a request is admitted only when KV memory for ``reserve_tokens`` (the
  maximum sequence length, as in the vLLM paper's "Orca (Max)" baseline) or its own prompt + output,
  whichever is larger, can be reserved up front. No preemption is ever needed.
- ``StaticScheduler`` (FasterTransformer, TensorRT-LLM ``gptSessionBenchmark``): when the replica is
  idle, up to ``max_num_seqs`` queued requests form a batch, memory for prompt + output reserved;
  one step prefills all prompts, then decode steps run the whole batch until its longest request is
  done. Finished members stay in the batch as padding (computed, discarded) until then.
"""

from __future__ import annotations

from sim.serving.kv_cache import BlockManager, blocks_for
from sim.serving.plan import Chunk, StepPlan
from sim.serving.request import SimRequest, Status
from sim.serving.schedulers import AcceptedTokens, BatchLimits, VllmScheduler, _one_token


class OrcaScheduler(VllmScheduler):
    """Iteration-level batching with memory reserved for the maximum length."""

    def __init__(self, limits: BatchLimits, blocks: BlockManager, reserve_tokens: int) -> None:
        super().__init__(limits, blocks)
        self.reserve_tokens = reserve_tokens

    def _reservation(self, request: SimRequest) -> int:
        return max(self.reserve_tokens, request.prompt_tokens + request.output_tokens)

    def can_ever_fit(self, request: SimRequest) -> str:
        need = blocks_for(self._reservation(request), self.blocks.block_size)
        if need > self.blocks.capacity:
            return (
                f"orca reserves {self._reservation(request)} tokens = {need} KV blocks per request; "
                f"the replica holds {self.blocks.capacity}"
            )
        return ""

    def _schedule(self, now_s: float) -> StepPlan:
        chunks: list[Chunk] = []
        budget = self.limits.max_batched_tokens
        for request in self._schedulable():
            n = self._query_tokens(request, budget) if request.in_decode else request.remaining_tokens
            chunks.append(Chunk(request, n, request.computed, request.in_decode))
            budget -= n
        prefills = 0
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            n = request.remaining_tokens
            if n > budget and prefills:
                break
            if n > budget and chunks:
                break
            need = blocks_for(self._reservation(request), self.blocks.block_size)
            if not self.blocks.can_allocate(need):
                break
            self.waiting.popleft()
            self.blocks.allocate(request.request_id, need)
            request.reserved_tokens = self._reservation(request)
            request.status = Status.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            self.running.append(request)
            chunks.append(Chunk(request, n, request.computed, False))
            budget -= n
            prefills += 1
        return StepPlan(chunks=tuple(chunks))


class StaticScheduler(VllmScheduler):
    """Request-level (static) batching: a batch runs to completion before the next one starts.
    Its steps run through pipeline stages one at a time (each step holds the whole batch)."""

    PIPELINE_CAPABLE = False

    def __init__(self, limits: BatchLimits, blocks: BlockManager) -> None:
        super().__init__(limits, blocks)
        self.batch: list[SimRequest] = []

    def has_work(self) -> bool:
        return bool(self.waiting or self.batch)

    def outstanding(self) -> int:
        return len(self.waiting) + sum(1 for r in self.batch if not r.done)

    def _schedule(self, now_s: float) -> StepPlan:
        if not self.batch:
            chunks: list[Chunk] = []
            while self.waiting and len(self.batch) < self.limits.max_num_seqs:
                request = self.waiting[0]
                need = blocks_for(request.prompt_tokens + request.output_tokens, self.blocks.block_size)
                if not self.blocks.can_allocate(need):
                    break
                self.waiting.popleft()
                self.blocks.allocate(request.request_id, need)
                request.reserved_tokens = request.prompt_tokens + request.output_tokens
                request.status = Status.RUNNING
                request.first_scheduled_s = now_s
                self.batch.append(request)
                self.running.append(request)
                chunks.append(Chunk(request, request.prompt_tokens, 0, False))
            return StepPlan(chunks=tuple(chunks))
        return StepPlan(
            chunks=tuple(
                Chunk(r, 1, r.computed, True, emits=not r.done) for r in self.batch
            )
        )

    def complete(self, plan: StepPlan, end_s: float, accepted: AcceptedTokens = _one_token) -> list[SimRequest]:
        left: list[SimRequest] = []
        for chunk in plan.chunks:
            request = chunk.request
            if not chunk.emits:
                continue
            if chunk.is_decode:
                emitted = min(accepted(request, chunk.query_tokens - 1), request.output_tokens - request.generated)
                request.computed += emitted
                request.emit(emitted, end_s)
            else:
                request.computed += chunk.query_tokens
                request.emit(1, end_s)
            if request.done:
                request.status = Status.FINISHED
                request.finish_s = end_s
                left.append(request)
        if all(r.done for r in self.batch):
            for request in self.batch:
                self.blocks.free_request(request.request_id)
            self.batch = []
            self.running = []
        return left
