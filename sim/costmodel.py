"""The one place that maps a workload ``Op`` to hardware cost functions.

Training (``sim.training.costs``) and serving (``sim.serving``) price ops only through this module,
so the analytic model, the DES and the search agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from hardware import cost
from hardware.collectives import Collective, GroupLinks, collective_time_s
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
    if op.kind == "gemm":
        return cost.gemm_time_s(
            gpu, op.m, op.n, op.k, precision=op.precision or precision, bytes_per_element=gemm_bytes_per_element(op),
            batch=op.batch,
        )
    if op.kind == "attention":
        if not op.sequences:
            return 0.0
        return cost.attention_time_s(
            gpu,
            op.sequences,
            heads=op.heads,
            kv_heads=op.kv_heads,
            head_dim=op.head_dim,
            v_head_dim=op.v_head_dim,
            precision=attention_precision(precision),
            bytes_per_element=op.bytes_per_element,
            causal=op.causal,
            backward=op.backward,
        )
    if op.kind == "memory":
        return cost.memory_op_time_s(gpu, op.bytes_moved)
    if op.kind == "collective":
        group = links.get(op.axis)
        if group is None or group.size <= 1:
            return 0.0
        return collective_time(Collective(op.collective), op.message_bytes, group)
    raise ValueError(f"op {op.name}: unknown kind '{op.kind}'")


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
