"""Closed-form serving estimates from the same step-cost model the engine uses.

``static_batch_latency_s`` is exactly what the DES does for one static batch of identical requests
(one prefill step of the whole batch, then ``output_tokens - 1`` decode steps with the context
growing by one each step), without the event loop, so the validation suite can price large
published batches quickly; a test holds the two to agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.serving.stepcost import StepCostModel


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticBatchTimes:
    prefill_s: float  # the context phase: time to the first token
    decode_s: float  # every decode step after it
    output_tokens: int

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def decode_per_token_s(self) -> float:
        steps = self.output_tokens - 1
        return self.decode_s / steps if steps else 0.0


def static_batch_times(cost: StepCostModel, *, batch: int, input_tokens: int, output_tokens: int) -> StaticBatchTimes:
    """Prefill and decode seconds of one static batch of ``batch`` identical requests."""
    prefill = cost.batch_time_s(batch * input_tokens, [(input_tokens, input_tokens)] * batch, batch)
    decode = 0.0
    for step in range(1, output_tokens):
        keys = input_tokens + step  # the token sampled last step is this step's query, after its context
        decode += cost.batch_time_s(batch, [(1, keys)] * batch, batch)
    return StaticBatchTimes(prefill_s=prefill, decode_s=decode, output_tokens=output_tokens)
