"""The one place that maps a workload ``Op`` to hardware cost functions.

Training (``sim.training.costs``) and serving (``sim.serving``) price ops only through this module,
so the analytic model, the DES and the search agree by construction.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from hardware import cost
from hardware.calibration import ROOFLINE, SOURCES
from hardware.collectives import (
    TOKEN_DISPATCH, Collective, GroupLinks, calibrated_collective_s, collective_time_s, token_dispatch_time_s,
)
from hardware.specs import GpuSpec
from workloads.graph import Op


@dataclass(frozen=True, slots=True, kw_only=True)
class PricedOps:
    """Seconds of a list of ops, split into compute (GEMM, attention, memory) and per-axis communication."""

    compute_s: float
    comm_s: Mapping[str, float] = field(default_factory=dict)
    flops: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values())


def gemm_bytes_per_element(op: Op) -> float:
    """Mean bytes per element over the three GEMM operands (activation in, weight, activation out),
    so a weight-only-quantized GEMM moves exactly its bytes through ``hardware.cost.gemm_time_s``."""
    act_elements = op.m * op.k + op.m * op.n
    weight_elements = op.k * op.n
    total = act_elements + weight_elements
    return (act_elements * op.bytes_per_element + weight_elements * op.weight_bytes_per_element) / total


# Active cost-source tallies (``tally_cost_sources``); empty in normal runs, so pricing pays one check.
_TALLIES: list[dict[str, float]] = []


@contextmanager
def tally_cost_sources() -> Iterator[dict[str, float]]:
    """Seconds priced by ``op_time_s`` inside the block, by cost source (measured, transferred,
    roofline; ``op_cost_source``)."""
    tally = {source: 0.0 for source in SOURCES}
    _TALLIES.append(tally)
    try:
        yield tally
    finally:
        _TALLIES.pop()


def source_fractions(seconds_by_source: Mapping[str, float]) -> dict[str, float]:
    """Seconds by source as fractions of their total (all roofline when nothing was priced)."""
    total = sum(seconds_by_source.values())
    if total <= 0:
        return {source: (1.0 if source == ROOFLINE else 0.0) for source in SOURCES}
    return {source: seconds_by_source.get(source, 0.0) / total for source in SOURCES}


def op_cost_source(op: Op, gpu: GpuSpec, *, precision: str, links: Mapping[str, GroupLinks]) -> str:
    """Where ``op_time_s`` takes this op's cost from: "measured" (the GPU's own calibration profile
    covers it), "transferred" (a profile fitted on another GPU covers it) or "roofline" (the
    analytic model: no profile, or outside its coverage). Decided by the same lookups the cost
    functions use."""
    calibration = gpu.calibration
    if op.kind == "collective":
        group = links.get(op.axis)
        if group is None or group.size <= 1 or group.calibration is None or op.collective == TOKEN_DISPATCH:
            return ROOFLINE
        if calibrated_collective_s(Collective(op.collective), op.message_bytes, group) is None:
            return ROOFLINE
        return group.calibration.source_for(gpu.name)
    if calibration is None:
        return ROOFLINE
    if op.kind == "gemm":
        covered = calibration.gemm_ratio(precision, op.m, op.n, op.k, op.batch // op.kernels) is not None
    elif op.kind == "attention":  # a profile's attention rows measure "flash"-family kernels only
        covered = bool(op.sequences) and op.kernel == "flash" and calibration.attention_ratio(
            precision=attention_precision(precision), num_sequences=len(op.sequences),
            query_tokens=sum(q for q, _ in op.sequences), key_tokens=sum(kv for _, kv in op.sequences),
            heads=op.heads, kv_heads=op.kv_heads, head_dim=op.head_dim,
            v_head_dim=op.head_dim if op.v_head_dim is None else op.v_head_dim, causal=op.causal, backward=op.backward,
        ) is not None
    elif op.kind == "memory":
        covered = op.bytes_moved > 0 and calibration.memory_efficiency(op.bytes_moved) is not None
    else:
        covered = False
    return calibration.source_for(gpu.name) if covered else ROOFLINE


def op_time_s(
    op: Op,
    gpu: GpuSpec,
    *,
    precision: str,
    links: Mapping[str, GroupLinks],
    collective_time: Callable[[Collective, float, GroupLinks], float] = collective_time_s,
) -> float:
    """Seconds of one op on ``gpu``; GEMMs and attention run at the dense peak of ``precision``;
    collectives use the process group of their axis from ``links`` (a missing axis = group of one).
    ``collective_time`` prices a collective: ``hardware.collectives.collective_time_s`` or a
    memoized wrapper of it (``sim.training.pricing_cache.PricingCache.collective_s``)."""
    seconds = _op_time_s(op, gpu, precision=precision, links=links, collective_time=collective_time)
    if _TALLIES:
        _TALLIES[-1][op_cost_source(op, gpu, precision=precision, links=links)] += seconds
    return seconds


def _op_time_s(
    op: Op,
    gpu: GpuSpec,
    *,
    precision: str,
    links: Mapping[str, GroupLinks],
    collective_time: Callable[[Collective, float, GroupLinks], float],
) -> float:
    if op.kind == "gemm":
        # a batch run as several kernels (one per expert) pays each kernel at its own share of the batch
        return op.kernels * cost.gemm_time_s(
            gpu, op.m, op.n, op.k, precision=op.precision or precision, bytes_per_element=gemm_bytes_per_element(op),
            batch=op.batch // op.kernels, split_accumulator=op.split_accumulator,
        )
    if op.kind == "attention":
        if not op.sequences:
            return 0.0
        return cost.attention_time_s(gpu, op.sequences, **_attention_kernel(op, precision))
    if op.kind == "memory":
        if op.kernels == 1:
            return cost.memory_op_time_s(gpu, op.bytes_moved)
        return op.kernels * cost.memory_op_time_s(gpu, op.bytes_moved / op.kernels)  # each kernel its share
    if op.kind == "collective":
        group = links.get(op.axis)
        if group is None or group.size <= 1:
            return 0.0
        if op.collective == TOKEN_DISPATCH:
            return token_dispatch_time_s(op.message_bytes, group, experts=op.routed_experts, top_k=op.experts_per_token)
        return collective_time(Collective(op.collective), op.message_bytes, group)
    raise ValueError(f"op {op.name}: unknown kind '{op.kind}'")


def _attention_kernel(op: Op, precision: str) -> dict[str, object]:
    """The keyword arguments of the hardware attention cost that describe ``op``'s kernel."""
    return dict(heads=op.heads, kv_heads=op.kv_heads, head_dim=op.head_dim, v_head_dim=op.v_head_dim,
                precision=attention_precision(precision), bytes_per_element=op.bytes_per_element, causal=op.causal,
                backward=op.backward, kernel_rate=op.kernel_rate, kernel=op.kernel)


def attention_totals_time_s(
    op: Op, gpu: GpuSpec, *, precision: str, num_sequences: int, query_tokens: int, key_tokens: int,
    keys_processed: float,
) -> float:
    """``op_time_s`` of the attention ``op`` run over a batch given by its sums instead of its
    ``sequences`` (which are ignored): ``num_sequences`` sequences of ``query_tokens`` new tokens and
    ``key_tokens`` keys in all, ``keys_processed`` the sum of ``hardware.cost.attention_keys_processed``.
    The same float as pricing the sequences (``hardware.cost.attention_time_from_totals_s``), for a
    caller that sums thousands of sequences faster than a list of them can be built; not counted by
    ``tally_cost_sources``."""
    if num_sequences == 0:
        return 0.0
    return cost.attention_time_from_totals_s(
        gpu, computed_keys=keys_processed, query_tokens=query_tokens, key_tokens=key_tokens,
        num_sequences=num_sequences, **_attention_kernel(op, precision),
    )


def op_flops(op: Op) -> float:
    """Matmul FLOPs of an op as executed (attention backward counts its recomputed scores too)."""
    if op.kind == "attention":
        forward = cost.attention_flops(
            op.sequences, heads=op.heads, head_dim=op.head_dim, causal=op.causal, v_head_dim=op.v_head_dim
        )
        return forward * cost.ATTENTION_BACKWARD_FLOP_RATIO if op.backward else forward
    return op.gemm_flops


def attention_precision(precision: str) -> str:
    """Fused attention runs in bf16 even when GEMMs run in fp8 (Transformer Engine's default)."""
    return "bf16" if precision == "fp8" else precision


def price_ops(ops: Sequence[Op], gpu: GpuSpec, *, precision: str, links: Mapping[str, GroupLinks]) -> PricedOps:
    """Sum the ops' seconds, keeping communication per axis apart from compute."""
    compute = 0.0
    flops = 0.0
    comm: dict[str, float] = {}
    for op in ops:
        seconds = op_time_s(op, gpu, precision=precision, links=links)
        if op.kind == "collective":
            comm[op.axis] = comm.get(op.axis, 0.0) + seconds
        else:
            compute += seconds
            flops += op_flops(op)
    return PricedOps(compute_s=compute, comm_s=comm, flops=flops)
