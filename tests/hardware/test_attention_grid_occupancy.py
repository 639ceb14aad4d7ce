"""Attention kernels a calibration profile did not time (backward passes, cuDNN, FlashAttention 1 and
2) keep the share of their benchmarked rate (the FlashAttention papers' grid: 16k tokens, 2048 / head
dim heads) that the profile's measured prefill surface keeps at their sequences x heads
(``CalibrationProfile.attention_grid_occupancy``)."""

from __future__ import annotations

import dataclasses

import math

import pytest

from hardware import cost
from hardware.calibration import ATTENTION_REFERENCE_TOKENS, ATTENTION_REFERENCE_WIDTH, PREFILL_AXES, CalibrationProfile, Surface
from hardware.catalog import analytic_gpu, get_gpu

H100 = get_gpu("h100-sxm-80gb")


def _attention_s(gpu, sequences: int, seq_len: int, heads: int, *, kernel: str, backward: bool = False,
                 causal: bool = True) -> float:
    return cost.attention_time_s(gpu, [(seq_len, seq_len)] * sequences, heads=heads, kv_heads=heads, head_dim=128,
                                 precision="bf16", bytes_per_element=2.0, causal=causal, backward=backward,
                                 kernel=kernel)


def _occupancy(sequences: int, seq_len: int, heads: int) -> float | None:
    return H100.calibration.attention_grid_occupancy(precision="bf16", num_sequences=sequences,
                                                     query_tokens=sequences * seq_len, heads=heads, head_dim=128)


def test_flash_attention_2_backward_at_a_small_grid_matches_nvidia_fuser_nsys() -> None:
    # NVIDIA/Fuser PR #4873 (2025-07-30), nsys of the GPT-3 175B layer's backward on 8 H100 80GB HBM3:
    # pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel 225.95 us for batch 1, sequence 2,048,
    # 96 / 8 = 12 heads of 128, causal (143 TFLOP/s: a 192-block grid of unequal causal work on 132 SMs)
    # (one timed round, the GPU idle around it: at the boost clock, hardware.cost.sustained_clock_factor)
    measured_s = 225.953e-6
    predicted_s = _attention_s(dataclasses.replace(H100, sustained_clock_Hz=None), 1, 2048, 12, kernel="flash2",
                               backward=True)
    assert predicted_s == pytest.approx(measured_s, rel=0.02)
    # without the occupancy the full-grid rate read 131 us, 42 % fast
    full_rate_s = _attention_s(dataclasses.replace(analytic_gpu("h100-sxm-80gb"), sustained_clock_Hz=None), 1, 2048,
                               12, kernel="flash2", backward=True)
    assert full_rate_s < 0.65 * measured_s


def test_occupancy_rises_with_heads_to_one_at_the_benchmarks_grid() -> None:
    shares = [_occupancy(1, 2048, heads) for heads in (1, 4, 8, 12)]
    assert all(0.0 < a < b < 1.0 for a, b in zip(shares, shares[1:]))
    assert shares[-1] == pytest.approx(0.59, abs=0.01)  # one sequence of 2,048 tokens, 12 heads
    for seq_len in (512, 2048, 4096, 16384):  # the FlashAttention benchmarks' own grids: 16k tokens, 16 heads of 128
        assert _occupancy(ATTENTION_REFERENCE_TOKENS // seq_len, seq_len, ATTENTION_REFERENCE_WIDTH // 128) == 1.0
    assert max(_occupancy(b, s, h) for b in (1, 4, 64, 256) for s in (512, 4096, 16384) for h in (1, 12, 96)) == 1.0


def test_measured_flash_forward_keeps_its_own_ratio() -> None:
    # the profile timed this kernel: its measured ratio applies, not the occupancy on top of it
    profile = H100.calibration
    ratio = profile.attention_ratio(precision="bf16", num_sequences=1, query_tokens=2048, key_tokens=2048, heads=12,
                                    kv_heads=12, head_dim=128, v_head_dim=128, causal=True, backward=False)
    analytic = _attention_s(analytic_gpu("h100-sxm-80gb"), 1, 2048, 12, kernel="flash")
    launch = cost.launch_overhead_s(H100)
    expected = (analytic - cost.launch_overhead_s(analytic_gpu("h100-sxm-80gb"))) / ratio + launch
    assert _attention_s(H100, 1, 2048, 12, kernel="flash") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kernel", ["cudnn", "flash2", "flash1"])
@pytest.mark.parametrize("backward", [False, True])
def test_other_kernels_pay_the_occupancy_of_their_grid(kernel: str, backward: bool) -> None:
    analytic_gpu_ = analytic_gpu("h100-sxm-80gb")
    launch = cost.launch_overhead_s(H100)
    analytic_launch = cost.launch_overhead_s(analytic_gpu_)
    for sequences, heads in ((1, 12), (2, 8), (256, 64)):
        share = _occupancy(sequences, 4096, heads)
        analytic = _attention_s(analytic_gpu_, sequences, 4096, heads, kernel=kernel, backward=backward)
        calibrated = _attention_s(H100, sequences, 4096, heads, kernel=kernel, backward=backward)
        assert calibrated - launch == pytest.approx((analytic - analytic_launch) / share, rel=1e-12)


def test_unmasked_and_cross_attention_shapes_are_left_at_the_analytic_rate() -> None:
    analytic_gpu_ = analytic_gpu("h100-sxm-80gb")
    launch = cost.launch_overhead_s(H100) - cost.launch_overhead_s(analytic_gpu_)
    unmasked = _attention_s(H100, 1, 2048, 12, kernel="cudnn", causal=False)
    assert unmasked == pytest.approx(_attention_s(analytic_gpu_, 1, 2048, 12, kernel="cudnn", causal=False) + launch)
    chunk = dict(heads=12, kv_heads=12, head_dim=128, precision="bf16", bytes_per_element=2.0, kernel="cudnn")
    prefix = cost.attention_time_s(H100, [(512, 2048)], **chunk)  # a chunk over a cached prefix
    assert prefix == pytest.approx(cost.attention_time_s(analytic_gpu_, [(512, 2048)], **chunk) + launch)


def test_a_profile_without_a_prefill_surface_has_no_occupancy() -> None:
    gpu = analytic_gpu("h100-sxm-80gb")
    assert CalibrationProfile(gpu=gpu.name, source="test").attention_grid_occupancy(
        precision="bf16", num_sequences=1, query_tokens=2048, heads=12, head_dim=128) is None
    flat = Surface(axes=PREFILL_AXES, grid=tuple((0.0, 20.0) for _ in PREFILL_AXES), values=(math.log(1.3),) * 16)
    profile = CalibrationProfile(gpu=gpu.name, source="test", attention_prefill=flat)
    # a surface flat in sequences and heads: every grid runs at the benchmarks' rate
    assert profile.attention_grid_occupancy(precision="bf16", num_sequences=1, query_tokens=2048, heads=12,
                                            head_dim=128) == pytest.approx(1.0)
