"""Pure compute cost functions: GEMM, fused attention, memory-bound ops, kernel launch.

Every function returns seconds for one kernel on one GPU. They are shared by the analytic model, the
DES and the search, so those cannot disagree. No SimPy, no workloads, no wall clock.

PROVISIONAL: plain roofline bodies; the efficiency model (tile/wave quantization, size curves,
attention head-dim and sequence effects) replaces them while keeping these signatures.
"""

from __future__ import annotations

from typing import Sequence

from hardware.specs import GpuSpec


# FlashAttention-2 backward = 2.5x forward matmul FLOPs: recomputed QK^T plus dV, dP, dQ, dK
# (five matmuls of the forward's size against two), so forward + backward = 3.5x forward.
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5


def launch_overhead_s(gpu: GpuSpec) -> float:
    """Fixed host-side cost of launching one kernel."""
    return gpu.efficiency.launch_overhead_s


def memory_op_time_s(gpu: GpuSpec, bytes_moved: float) -> float:
    """A memory-bound kernel (elementwise, norm, copy) that reads plus writes ``bytes_moved`` of HBM."""
    return bytes_moved / (gpu.hbm_bandwidth_Bps * gpu.efficiency.memory) + launch_overhead_s(gpu)


def gemm_time_s(
    gpu: GpuSpec,
    m: int,
    n: int,
    k: int,
    *,
    precision: str,
    bytes_per_element: float,
    batch: int = 1,
) -> float:
    """``batch`` independent (m x k) @ (k x n) matmuls at ``precision``; operands and output of
    ``bytes_per_element`` each."""
    flops = 2.0 * m * n * k * batch
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element * batch
    compute_s = flops / (gpu.peak(precision) * gpu.efficiency.gemm)
    memory_s = bytes_moved / (gpu.hbm_bandwidth_Bps * gpu.efficiency.memory)
    return max(compute_s, memory_s) + launch_overhead_s(gpu)


def attention_flops(
    sequences: Sequence[tuple[int, int]], *, heads: int, head_dim: int, causal: bool, v_head_dim: int | None = None
) -> float:
    """Forward score (QK^T) and value (AV) FLOPs for ``sequences`` of (new query tokens, total keys).

    A sequence's queries are its last ``q`` positions among ``kv`` keys. Causal masking skips the
    keys after each query, so query i (0-based among the new ones) sees ``kv - q + i + 1`` keys.
    """
    v_dim = head_dim if v_head_dim is None else v_head_dim
    keys_seen = 0.0
    for q, kv in sequences:
        if causal:
            keys_seen += q * (kv - q) + q * (q + 1) / 2.0
        else:
            keys_seen += float(q) * kv
    return 2.0 * heads * (head_dim + v_dim) * keys_seen


def attention_time_s(
    gpu: GpuSpec,
    sequences: Sequence[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    precision: str,
    bytes_per_element: float,
    causal: bool = True,
    backward: bool = False,
    v_head_dim: int | None = None,
) -> float:
    """One fused (FlashAttention-style) kernel over a varlen batch of ``sequences``.

    Each entry is (new query tokens, total key tokens including the new ones): prefill is (s, s),
    a prefill chunk with cached prefix is (chunk, prefix + chunk), decode is (1, context). The
    backward pass costs 2.5x the forward FLOPs (FlashAttention-2's count: recompute of the scores
    plus four gradient matmuls). Bytes: Q, O read/written once; K, V read once per sequence.
    """
    v_dim = head_dim if v_head_dim is None else v_head_dim
    flops = attention_flops(sequences, heads=heads, head_dim=head_dim, causal=causal, v_head_dim=v_dim)
    q_tokens = sum(q for q, _ in sequences)
    kv_tokens = sum(kv for _, kv in sequences)
    bytes_moved = (q_tokens * heads * (head_dim + v_dim) + kv_tokens * kv_heads * (head_dim + v_dim)) * bytes_per_element
    if backward:
        flops *= ATTENTION_BACKWARD_FLOPS_RATIO
        bytes_moved *= 2.0
    compute_s = flops / (gpu.peak(precision) * gpu.efficiency.attention)
    memory_s = bytes_moved / (gpu.hbm_bandwidth_Bps * gpu.efficiency.memory)
    return max(compute_s, memory_s) + launch_overhead_s(gpu)
