"""A calibrated kernel never beats its compulsory HBM traffic at the datasheet bandwidth
(``hardware.cost.calibrated_kernel_s``): measurement tables re-run a kernel on buffers that can stay
in L2, a model's layers cannot."""

from __future__ import annotations

import dataclasses
import math

from hardware import cost
from hardware.calibration import DECODE_AXES, GEMM_AXES, CalibrationProfile, Surface
from hardware.catalog import analytic_gpu


def _flat(axes: tuple[str, ...], log_ratio: float) -> Surface:
    """A surface covering log2 coordinates 0..20 on every axis with one constant log ratio."""
    grid = tuple((0.0, 20.0) for _ in axes)
    return Surface(axes=axes, grid=grid, values=(log_ratio,) * 2 ** len(axes))


def _gpu(log_ratio: float):
    gpu = analytic_gpu("a100-sxm-80gb")
    profile = CalibrationProfile(
        gpu=gpu.name, source="test", gemm={"bf16": _flat(GEMM_AXES, log_ratio)},
        attention_decode=_flat(DECODE_AXES, log_ratio),
    )
    return gpu, dataclasses.replace(gpu, calibration=profile)


def test_a_gemm_faster_than_hbm_allows_is_held_at_the_hbm_bound() -> None:
    analytic, calibrated = _gpu(math.log(100.0))  # the table claims 100x the analytic efficiency
    m, n, k = 16, 4096, 4096  # a decode GEMM: weight streaming dominates
    bytes_moved = (m * k + k * n + m * n) * 2.0
    seconds = cost.gemm_time_s(calibrated, m, n, k, precision="bf16", bytes_per_element=2.0)
    assert seconds == bytes_moved / calibrated.hbm_bandwidth_Bps + cost.launch_overhead_s(calibrated)
    # the bound is the datasheet bandwidth: faster than the analytic model's achievable fraction
    assert seconds < cost.gemm_time_s(analytic, m, n, k, precision="bf16", bytes_per_element=2.0)


def test_a_slower_measurement_is_applied_as_measured() -> None:
    analytic, calibrated = _gpu(math.log(0.5))  # the table says half the analytic efficiency
    launch = cost.launch_overhead_s(analytic)
    for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096)):
        base = cost.gemm_time_s(analytic, m, n, k, precision="bf16", bytes_per_element=2.0) - launch
        slow = cost.gemm_time_s(calibrated, m, n, k, precision="bf16", bytes_per_element=2.0) - launch
        assert math.isclose(slow, 2.0 * base, rel_tol=1e-12)


def test_decode_attention_never_reads_the_kv_cache_faster_than_hbm() -> None:
    _, calibrated = _gpu(math.log(100.0))
    batch, context, heads, head_dim = 256, 256, 32, 128
    seconds = cost.attention_time_s(
        calibrated, [(1, context)] * batch, heads=heads, kv_heads=heads, head_dim=head_dim, precision="bf16",
        bytes_per_element=2.0,
    )
    kv_and_q_bytes = (batch * heads + batch * context * heads) * 2 * head_dim * 2.0
    assert seconds == kv_and_q_bytes / calibrated.hbm_bandwidth_Bps + cost.launch_overhead_s(calibrated)
