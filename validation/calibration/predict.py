"""Predict measurement rows with llmsim's cost functions (the same ones every simulation uses).

Each row's prediction is the device time of the kernel or collective it times: the cost function's
seconds less the host launch overhead (measurement tables and the harness time back-to-back calls on
the device, so the launch latency is hidden), except ``launch`` rows, which time exactly that.
Rows llmsim has no single cost function for (``moe``: a fused multi-GEMM kernel), precisions the
GPU has no peak for, and attention rows whose KV cache format differs from the compute format
predict NaN and are reported as not modelled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np
import pandas as pd

from hardware import cost
from hardware.calibration import ATTENTION_PRECISIONS, ROOFLINE, CalibrationProfile
from hardware.catalog import get_network, get_node
from hardware.collectives import Collective, calibrated_collective_s, collective_time_s
from hardware.specs import GpuSpec
from hardware.topology import build_cluster
from hardware.transfer import transfer_time_s
from validation.microbench.schema import COLLECTIVE_OPS

BYTES_PER_ELEMENT = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}
# Op kinds of the accuracy report (INTERFACE.md: validate --measurements).
KINDS = ("gemm", "attention_prefill", "attention_decode", *COLLECTIVE_OPS, "memory", "host_to_device", "launch")
KIND_OF_OP = {"device_copy": "memory", "device_to_host": "host_to_device"}


def kind_of(op: str) -> str:
    return KIND_OF_OP.get(op, op)


def with_profile(gpu: GpuSpec, profile: CalibrationProfile | None) -> GpuSpec:
    return dataclasses.replace(gpu, calibration=profile)


def _int(value) -> int:
    return int(value)


class Predictor:
    """Prices measurement rows on one GPU (with or without a calibration profile)."""

    def __init__(self, gpu: GpuSpec) -> None:
        self.gpu = gpu
        node = get_node(gpu.default_node)
        self._node = node
        self._network = get_network(node.default_network)
        self._links: dict[int, object] = {}

    def links(self, ranks: int):
        if ranks not in self._links:
            cluster = build_cluster(self.gpu, self._node, self._network, max(ranks, self._node.gpus_per_node))
            self._links[ranks] = cluster.group_links(list(range(ranks)))
        return self._links[ranks]

    def row_s(self, row) -> tuple[float, str]:
        """(predicted device seconds or NaN, cost source of the calibrated part)."""
        gpu = self.gpu
        op = row.op
        precision = row.precision if isinstance(row.precision, str) else "bf16"
        launch = cost.launch_overhead_s(gpu)
        calibration = gpu.calibration
        source = ROOFLINE if calibration is None else calibration.source_for(gpu.name)
        if op == "gemm":
            if precision not in gpu.peak_flops_per_s or precision not in BYTES_PER_ELEMENT:
                return math.nan, ROOFLINE
            m, n, k, batch = _int(row.m), _int(row.n), _int(row.k), _int(row.batch) if not pd.isna(row.batch) else 1
            seconds = cost.gemm_time_s(gpu, m, n, k, precision=precision, bytes_per_element=BYTES_PER_ELEMENT[precision], batch=batch) - launch
            covered = calibration is not None and calibration.gemm_ratio(precision, m, n, k, batch) is not None
            return seconds, source if covered else ROOFLINE
        if op in ("attention_prefill", "attention_decode"):
            kv_precision = row.kv_precision if isinstance(row.kv_precision, str) else precision
            if kv_precision != precision or precision not in ATTENTION_PRECISIONS or precision not in gpu.peak_flops_per_s:
                return math.nan, ROOFLINE
            batch, q, kv = _int(row.batch), _int(row.seq_len), _int(row.kv_len)
            heads, kv_heads, head_dim = _int(row.heads), _int(row.kv_heads), _int(row.head_dim)
            causal = bool(row.causal) if not pd.isna(row.causal) else True
            seconds = cost.attention_time_s(
                gpu, [(q, kv)] * batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim, precision=precision,
                bytes_per_element=BYTES_PER_ELEMENT[precision], causal=causal,
            ) - launch
            covered = calibration is not None and calibration.attention_ratio(
                precision=precision, num_sequences=batch, query_tokens=q * batch, key_tokens=kv * batch, heads=heads, kv_heads=kv_heads,
                head_dim=head_dim, v_head_dim=head_dim, causal=causal, backward=False) is not None
            return seconds, source if covered else ROOFLINE
        if op in COLLECTIVE_OPS:
            ranks = _int(row.num_gpus)
            if ranks > self._node.gpus_per_node:
                return math.nan, ROOFLINE
            links = self.links(ranks)
            kind = Collective(op)
            message = float(row.message_bytes)
            seconds = collective_time_s(kind, message, links) - links.launch_overhead_s
            covered = calibrated_collective_s(kind, message, links) is not None
            return seconds, source if covered else ROOFLINE
        if op in ("memory", "device_copy"):
            moved = float(row.bytes)
            covered = calibration is not None and calibration.memory_efficiency(moved) is not None
            return cost.stream_kernel_time_s(gpu, moved) - launch, source if covered else ROOFLINE  # STREAM-like kernels
        if op in ("host_to_device", "device_to_host"):
            src, dst = ("cpu", "hbm") if op == "host_to_device" else ("hbm", "cpu")
            return transfer_time_s(float(row.bytes), src, dst, self._node, gpu), ROOFLINE
        if op == "launch":
            covered = calibration is not None and calibration.launch_overhead_s is not None
            return launch, source if covered else ROOFLINE
        return math.nan, ROOFLINE

    def predict(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, cost source) per row of ``frame``."""
        seconds = np.full(len(frame), math.nan)
        sources = np.empty(len(frame), dtype=object)
        for i, row in enumerate(frame.itertuples(index=False)):
            seconds[i], sources[i] = self.row_s(row)
        return seconds, sources


def iter_rows(frame: pd.DataFrame) -> Iterator:
    return frame.itertuples(index=False)
