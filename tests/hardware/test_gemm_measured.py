"""GEMM cost model against measured kernel tables (aiconfigurator-core 0.12.0, Apache-2.0).

Samples of 300 bf16 rows per GPU (provenance in the CSV headers, tests/data/README.md): A100 SXM 80GB
(SGLang 0.5.10 table) and H200 (vLLM 0.24.0 table), m = 1..8192, n and k in 1024..16384. The tables
time each GEMM on the GPU (back-to-back replays), so host launch cost is excluded from the prediction
as in the MAMF test. One description per GPU and architecture; nothing is fitted per shape.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from hardware import cost
from hardware.catalog import analytic_gpu as get_gpu  # the analytic model (no calibration profile) is under test

DATA = Path(__file__).resolve().parent.parent / "data"
SAMPLES = {"a100-sxm-80gb": "aic_a100_gemm_bf16_sample.csv", "h200-sxm-141gb": "aic_h200_gemm_bf16_sample.csv"}
# Thresholds: what the model achieves on these samples (A100 median 5.9 %, p90 21.7 %; H200 median
# 6.0 %, p90 16.7 %), rounded up. Before the split-K/stream-K/GEMV-bandwidth terms: A100 17 % / 42 %,
# H200 12 % / 39 % (full filtered tables, 14,112 rows each).
THRESHOLDS = {"a100-sxm-80gb": (0.07, 0.23), "h200-sxm-141gb": (0.07, 0.18)}


def _rows(filename: str) -> list[tuple[int, int, int, float]]:
    with open(DATA / filename, newline="") as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        return [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["latency_ms"]) * 1e-3) for r in reader]


def _at_table_clock(gpu):
    """The GPU at the clock its measured tables ran at: the Hopper tables time short bursts at the boost
    clock (shipped profile gemm_clock = "boost", validation/calibration/ship.py), the A100's run at the
    sustained clock."""
    from hardware.calibration import shipped_profile

    shipped = shipped_profile(gpu.name)
    if shipped is not None and shipped.profile.gemm_clock == "boost":
        return dataclasses.replace(gpu, sustained_clock_Hz=None)
    return gpu


def _errors(name: str) -> np.ndarray:
    gpu = _at_table_clock(get_gpu(name))
    errors = []
    for m, n, k, measured_s in _rows(SAMPLES[name]):
        predicted_s = cost.gemm_time_s(gpu, m, n, k, precision="bf16", bytes_per_element=2) - cost.launch_overhead_s(gpu)
        errors.append(predicted_s / measured_s - 1.0)
    return np.array(errors)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_gemm_matches_measured_table(name: str) -> None:
    errors = np.abs(_errors(name))
    assert len(errors) == 300
    median_limit, p90_limit = THRESHOLDS[name]
    assert np.median(errors) <= median_limit, (name, float(np.median(errors)))
    assert np.quantile(errors, 0.9) <= p90_limit, (name, float(np.quantile(errors, 0.9)))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_gemm_no_systematic_bias_by_m(name: str) -> None:
    """Small-m (weight streaming, split-K) and large-m (compute) rows are each unbiased within 10 %."""
    rows = _rows(SAMPLES[name])
    errors = _errors(name)
    m = np.array([r[0] for r in rows])
    for lo, hi in ((1, 64), (65, 768), (769, 8192)):
        band = errors[(m >= lo) & (m <= hi)]
        assert abs(np.median(band)) <= 0.10, (name, lo, hi, float(np.median(band)))


def test_gemv_streams_at_measured_weight_bandwidth() -> None:
    """Large m <= 16 rows are bound by weight streaming at efficiency.gemm_memory: measured over
    fill + reduction floor + bytes / (HBM x gemm_memory) has median within 5 % of 1 and every row within
    20 %, on both GPUs (A100 streams below its STREAM fraction, H200 above)."""
    for name, filename in SAMPLES.items():
        gpu = get_gpu(name)
        ratios = []
        for m, n, k, measured_s in _rows(filename):
            bytes_moved = (m * k + k * n + m * n) * 2.0
            if m > 16 or bytes_moved < 100e6:
                continue
            streaming_s = bytes_moved / (gpu.hbm_bandwidth_Bps * gpu.efficiency.gemm_memory)
            ratios.append(measured_s / (streaming_s + cost.MEMORY_FILL_S + cost.GEMM_SPLIT_K_REDUCE_S))
        assert len(ratios) >= 10, name
        assert abs(np.median(ratios) - 1.0) <= 0.05, (name, float(np.median(ratios)))
        assert max(abs(r - 1.0) for r in ratios) <= 0.20, (name, ratios)


TRAINING_SHAPES = "aic_gemm_bf16_training_shapes.csv"


def _training_errors(gpu) -> np.ndarray:
    errors = []
    with open(DATA / TRAINING_SHAPES, newline="") as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            if r["gpu"] != gpu.name:
                continue
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            predicted_s = cost.gemm_time_s(gpu, m, n, k, precision="bf16", bytes_per_element=2) - cost.launch_overhead_s(gpu)
            errors.append(predicted_s / (float(r["latency_ms"]) * 1e-3) - 1.0)
    assert len(errors) == 100
    return np.array(errors)


@pytest.mark.parametrize(("name", "table_clock"), [("a100-sxm-80gb", "sustained"), ("h100-sxm-80gb", "boost")])
def test_gemm_unbiased_at_training_shapes(name: str, table_clock: str) -> None:
    """Training-size GEMMs (m = micro-batch x sequence 4,096..32,768, n and k 2,048..16,384; 100 rows per
    GPU of the tables): the model at the clock the table ran at (the shipped profile's gemm_clock) has
    signed median within 3 %, absolute median within 5 %. Measured: A100 +1.7 % / 1.8 %, H100 +0.3 % /
    1.9 %. At the boost clock the A100 model is 5.9 % fast (signed median -5.9 %): the sustained clock
    (1,305 of 1,410 MHz) is what closes it. The H100 rows ran in short bursts at the boost clock
    (validation/calibration/ship.py), so the model matches them there and a sustained workload runs
    1,630 / 1,830 of their rate."""
    gpu = get_gpu(name)
    if table_clock == "boost":
        gpu = dataclasses.replace(gpu, sustained_clock_Hz=None)
    errors = _training_errors(gpu)
    assert abs(np.median(errors)) <= 0.03, (name, float(np.median(errors)))
    assert np.median(np.abs(errors)) <= 0.05, (name, float(np.median(np.abs(errors))))
    if gpu.sustained_clock_Hz is not None:
        boost = _training_errors(dataclasses.replace(gpu, sustained_clock_Hz=None))
        assert np.median(boost) < -0.04, float(np.median(boost))


def test_shipped_fp8_gemms_are_the_measured_kernels_without_quantization() -> None:
    """fp8 GEMMs at training sizes (tests/data/aic_fp8_gemm_kernel_training_shapes.csv: the TensorRT-LLM
    rows less the dynamic activation quantization they time, 100 rows per GPU). The shipped H100/H200
    profiles reproduce the GEMM alone (grid nodes: median 0.0 %), far from the rows with the
    quantization counted (which training prices as its own cast ops); the analytic fast-accumulation
    rate (fp8 MAMF x 1.1) is 10-11 % fast here (signed median), what the shipped surfaces correct."""
    from hardware.catalog import get_gpu as shipped_gpu

    with open(DATA / "aic_fp8_gemm_kernel_training_shapes.csv", newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for name in ("h100-sxm-80gb", "h200-sxm-141gb"):
        part = [r for r in rows if r["gpu"] == name]
        assert len(part) == 100
        for gpu, bound in ((_at_table_clock(shipped_gpu(name)), None), (_at_table_clock(get_gpu(name)), -0.05)):
            errors, with_quant = [], []
            for r in part:
                m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
                seconds = cost.gemm_time_s(gpu, m, n, k, precision="fp8", bytes_per_element=1) - cost.launch_overhead_s(gpu)
                errors.append(seconds / (float(r["latency_ms"]) * 1e-3) - 1.0)
                with_quant.append(seconds / (float(r["with_quantization_ms"]) * 1e-3) - 1.0)
            if bound is None:
                assert np.median(np.abs(errors)) <= 0.01 and np.percentile(np.abs(errors), 90) <= 0.03, name
                assert np.median(with_quant) < -0.10, name  # the quantization is >= 10 % of those rows
            else:
                assert np.median(errors) < bound, (name, float(np.median(errors)))
