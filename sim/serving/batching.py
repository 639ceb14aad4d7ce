"""The pre-PagedAttention batching baselines and TensorRT-LLM's in-flight batcher, with the same
interface as ``VllmScheduler``.

- ``OrcaScheduler`` (Yu et al., OSDI'22): iteration-level batching. Every step runs one decode token
  of each running request plus whole prompts of newly admitted ones (token budget
  ``max_batched_tokens``); a request is admitted only when KV memory for ``reserve_tokens`` (the
  maximum sequence length, as in the vLLM paper's "Orca (Max)" baseline) or its own prompt + output,
  whichever is larger, can be reserved up front. No preemption is ever needed.
- ``StaticScheduler`` (FasterTransformer, TensorRT-LLM ``gptSessionBenchmark``): when the replica is
  idle, up to ``max_num_seqs`` queued requests form a batch, memory for prompt + output reserved;
  one step prefills all prompts, then decode steps run the whole batch until its longest request is
  done. Finished members stay in the batch as padding (computed, discarded) until then.
- ``InflightScheduler`` (TensorRT-LLM executor, 0.10+ in-flight batching as trtllm-bench runs it):
  the capacity scheduler GUARANTEED_NO_EVICT admits queued requests first come first served while
  fewer than ``max_num_seqs`` are active and the KV blocks of the request's whole length (prompt +
  output) can be reserved; each step the micro-batch scheduler takes one token of every generating
  request, then fills what is left of the ``max_batched_tokens`` budget (TensorRT-LLM
  ``max_num_tokens``, context and generation tokens together) with context tokens, first come first
  served. With ``chunked_prefill`` (``enable_chunked_context``) a prompt that does not fit is cut to
  the budget, rounded down to whole KV blocks (TensorRT-LLM ``setCtxRequestsChunkSize``, chunk unit
  ``tokens_per_block``); without it a prompt waits until it fits whole.
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

    def _admit_head(self, now_s: float) -> bool:
        """Admit the head of the queue if the KV blocks of its reservation are free (False: it waits)."""
        request = self.waiting[0]
        need = blocks_for(self._reservation(request), self.blocks.block_size)
        if not self.blocks.can_allocate(need):
            return False
        self.waiting.popleft()
        self.blocks.allocate(request.request_id, need)
        request.reserved_tokens = self._reservation(request)
        request.status = Status.RUNNING
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now_s
        self.running.append(request)
        return True

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
            if not self._admit_head(now_s):
                break
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


class InflightScheduler(OrcaScheduler):
    """TensorRT-LLM's in-flight batcher: GUARANTEED_NO_EVICT admission, generation tokens first, then
    context chunks first come first served in the rest of the token budget (module docstring)."""

    def can_ever_fit(self, request: SimRequest) -> str:
        reason = super().can_ever_fit(request)
        budget, unit = self.limits.max_batched_tokens, self.blocks.block_size
        if reason or request.prompt_tokens <= budget:
            return reason
        if not self.limits.chunked_prefill:
            return (f"prompt {request.prompt_tokens} tokens exceed max_batched_tokens {budget}, and without "
                    "chunked_prefill a prompt must run in one step")
        if budget < unit:
            return (f"prompt {request.prompt_tokens} tokens must be cut into chunks of whole KV blocks of "
                    f"{unit} tokens; max_batched_tokens {budget} holds none")
        return ""

    def _schedule(self, now_s: float) -> StepPlan:
        limits = self.limits
        budget = limits.max_batched_tokens
        # capacity scheduler: admit while a slot and the whole request's KV are free
        while self.waiting and len(self.running) < limits.max_num_seqs and self._admit_head(now_s):
            pass
        chunks: list[Chunk] = []
        contexts: list[SimRequest] = []
        # hot loop (one pass per step over the running requests): ``in_decode`` inlined, methods bound
        add_chunk, add_context = chunks.append, contexts.append
        for request in self._schedulable():
            generated = request.generated
            if generated and request.prompt_tokens + generated - request.computed == 1:
                if budget <= 0:
                    break
                add_chunk(Chunk(request, 1, request.computed, True))
                budget -= 1
            else:
                add_context(request)
        unit = self.blocks.block_size
        for request in contexts:
            if budget <= 0:
                break
            remaining = request.remaining_tokens
            n = remaining
            if remaining > budget:
                if not limits.chunked_prefill:
                    continue  # an unchunked prompt waits until it fits whole
                n = budget // unit * unit
                if n <= 0:
                    break
            chunks.append(Chunk(request, n, request.computed, False))
            budget -= n
        return StepPlan(chunks=tuple(chunks))
