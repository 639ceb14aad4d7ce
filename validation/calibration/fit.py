"""Fit a calibration profile (``hardware.calibration``) from measurement rows.

For GEMM and attention the fitted quantity is efficiency relative to the analytic model,
log(measured efficiency / analytic efficiency) = log(analytic seconds / measured seconds), on the
regular grid spanned by the distinct log2 shape coordinates of the measurements. A grid node with
measurements gets their mean; an empty node (a shape combination never measured, or held out) gets
the mean of its filled neighbours along every axis, repeated until the grid is full (a discrete
harmonic fill, i.e. interpolation through the measured neighbourhood). Predictions then interpolate
multilinearly between nodes (``scipy.interpolate.RegularGridInterpolator``). Collectives keep the
median measured seconds per (op, group size, message bytes); memory-bound kernels the median
achieved fraction of HBM bandwidth per size; launch the median launch row.

Tables collected under several stacks (framework, version, kernel source) are not mixed: per op
kind and precision the fit takes the stack with the most rows unless ``framework`` names one
(``select_stacks``), and records it as the surface's provenance.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from hardware.calibration import (
    DECODE_AXES,
    GEMM_AXES,
    GEMM_CLOCKS,
    PREFILL_AXES,
    CalibrationProfile,
    Curve,
    Surface,
)
from hardware.specs import GpuSpec
from validation.calibration.predict import Predictor, with_profile
from validation.microbench.schema import COLLECTIVE_OPS

STACK_COLUMNS = ("framework", "framework_version", "kernel_source")
# Rows of one grid node are averaged; coordinates closer than this (in log2) are the same node.
_NODE_DIGITS = 6


def select_stacks(frame: pd.DataFrame, framework: str | None = None) -> pd.DataFrame:
    """Per (op, precision) keep the rows of one stack: the named framework's (its largest
    version/kernel group) or else the largest group. Rows without stack columns (the harness) form
    one group."""
    keys = frame[list(STACK_COLUMNS)].astype("string").fillna("")
    if framework is not None:
        keep = (keys["framework"] == framework) | (keys["framework"] == "")
        frame, keys = frame[keep.to_numpy()], keys[keep.to_numpy()]
    stack = keys["framework"] + "|" + keys["framework_version"] + "|" + keys["kernel_source"]
    group = frame["op"].astype(str) + "|" + frame["precision"].astype("string").fillna("").astype(str)
    counts = pd.DataFrame({"group": group.to_numpy(), "stack": stack.to_numpy()}).value_counts().reset_index(name="rows")
    counts = counts.sort_values(["group", "rows", "stack"], ascending=[True, False, True])
    best = dict(counts.drop_duplicates("group")[["group", "stack"]].itertuples(index=False, name=None))
    keep = np.array([best[g] == s for g, s in zip(group.to_numpy(), stack.to_numpy())], dtype=bool)
    return frame[keep]


def stack_label(frame: pd.DataFrame) -> str:
    labels = sorted({" ".join(str(v) for v in t if isinstance(v, str) and v) for t in frame[list(STACK_COLUMNS)].astype("string").fillna("").itertuples(index=False, name=None)})
    return "; ".join(l for l in labels if l) or "harness"


def _fill(grid: np.ndarray) -> np.ndarray:
    """Fill NaN nodes with the mean of their filled axis neighbours, repeatedly until full. (Equal
    weights: on the H100 GEMM table, half held out, weighting neighbours by inverse log2 distance or
    favouring one axis gave higher held-out errors, e.g. p90 16.8 % instead of 15.1 %.)"""
    grid = grid.copy()
    while np.isnan(grid).any():
        total = np.zeros_like(grid)
        weight = np.zeros_like(grid)
        filled = ~np.isnan(grid)
        values = np.where(filled, grid, 0.0)
        for axis in range(grid.ndim):
            n = grid.shape[axis]
            if n < 2:
                continue
            lo = [slice(None)] * grid.ndim
            hi = [slice(None)] * grid.ndim
            lo[axis], hi[axis] = slice(0, n - 1), slice(1, n)
            lo, hi = tuple(lo), tuple(hi)
            # each node takes its lower and upper neighbour
            total[hi] += values[lo]
            weight[hi] += filled[lo]
            total[lo] += values[hi]
            weight[lo] += filled[hi]
        new = np.isnan(grid) & (weight > 0)
        if not new.any():
            raise ValueError("calibration grid has no measured node")
        grid[new] = total[new] / weight[new]
    return grid


def fit_surface(coords: np.ndarray, log_ratio: np.ndarray, axes: tuple[str, ...], provenance: str) -> Surface:
    """A ``Surface`` over the distinct coordinates of ``coords`` (rows x axes, log2)."""
    coords = np.round(np.asarray(coords, dtype=float), _NODE_DIGITS)
    axis_values = [np.unique(coords[:, j]) for j in range(coords.shape[1])]
    index = tuple(np.searchsorted(axis_values[j], coords[:, j]) for j in range(coords.shape[1]))
    shape = tuple(len(a) for a in axis_values)
    total = np.zeros(shape)
    count = np.zeros(shape)
    np.add.at(total, index, log_ratio)
    np.add.at(count, index, 1.0)
    grid = np.where(count > 0, total / np.maximum(count, 1.0), np.nan)
    grid = _fill(grid)
    return Surface(
        axes=axes, grid=tuple(tuple(float(v) for v in a) for a in axis_values),
        values=tuple(float(v) for v in grid.ravel()), rows=len(log_ratio), provenance=provenance,
    )


def latency_curve(part: pd.DataFrame) -> Curve | None:
    """Median measured seconds per message size of one collective and group size, made non-decreasing:
    a larger message never takes less time (it could be sent as the smaller one plus the rest), so the
    curve is the closest non-decreasing one in log seconds (isotonic regression) and a noisy dip or
    spike in the table is averaged with its neighbours instead of kept."""
    by_size = part.groupby("message_bytes")["latency_s"].median()
    by_size = by_size[by_size.index > 0]
    if len(by_size) > 1:
        from scipy.optimize import isotonic_regression

        monotone = np.exp(isotonic_regression(np.log(by_size.to_numpy())).x)
        by_size = pd.Series(monotone, index=by_size.index)
    if not len(by_size):
        return None
    return Curve(
        log2_x=tuple(float(v) for v in np.log2(by_size.index.to_numpy(dtype=float))),
        y=tuple(float(v) for v in by_size.to_numpy()), rows=len(part), provenance=stack_label(part),
    )


def _version_key(version: str) -> tuple[int, ...]:
    """Numeric parts of a version string, for ordering (0.5.10 after 0.5.9)."""
    return tuple(int(v) for v in re.findall(r"\d+", version))


def custom_all_reduce_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Per framework, the custom all-reduce rows of one (version, kernel source): the CUDA-graph
    variant where the table has one (serving engines capture decode steps in CUDA graphs), then the
    newest version."""
    frame = frame[frame["op"] == "custom_all_reduce"]
    keep = []
    for _, part in frame.groupby("framework"):
        kernels = part["kernel_source"].astype("string").fillna("")
        versions = part["framework_version"].astype("string").fillna("")
        groups = sorted({(k, v) for k, v in zip(kernels, versions)},
                        key=lambda kv: ("graph" in kv[0].lower(), _version_key(kv[1]), kv[0]))
        kernel, version = groups[-1]
        keep.append(part[((kernels == kernel) & (versions == version)).to_numpy()])
    return pd.concat(keep) if keep else frame


def _log_ratio(analytic_s: np.ndarray, measured_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(analytic_s) & (analytic_s > 0) & (measured_s > 0)
    return ok, np.log(analytic_s[ok] / measured_s[ok])


def fit_profile(
    frame: pd.DataFrame, gpu: GpuSpec, *, framework: str | None = None, source: str = "",
    gemm_precisions: Sequence[str] | None = None, gemm_clock: str = "sustained",
) -> CalibrationProfile:
    """Fit every op kind present in ``frame`` (measurement rows of ``gpu``) into a profile
    (GEMM surfaces only for ``gemm_precisions`` when given).

    ``gemm_clock``: the SM clock the GEMM and attention rows ran at (``hardware.calibration.GEMM_CLOCKS``).
    Their ratios are taken against the analytic model at that clock: at ``"sustained"`` with the GPU's
    sustained clock factor, at ``"boost"`` without it (rows timed in short bursts between idle gaps),
    so that predictions, which price every GEMM and attention kernel at the sustained clock, slow a
    boost-clock table's compute-bound shapes by sustained / boost and reproduce a sustained-clock table."""
    if gemm_clock not in GEMM_CLOCKS:
        raise ValueError(f"gemm_clock = {gemm_clock!r} must be one of {', '.join(GEMM_CLOCKS)}")
    # every serving framework's own all-reduce is kept (a serving stack picks its framework's), not only
    # the named framework's
    custom_frame = frame[frame["op"] == "custom_all_reduce"]
    frame = select_stacks(frame[frame["op"] != "custom_all_reduce"], framework)
    table_gpu = gpu if gemm_clock == "sustained" else dataclasses.replace(gpu, sustained_clock_Hz=None)
    analytic = Predictor(with_profile(table_gpu, None))  # the analytic model at the tables' clock
    gemm: dict[str, Surface] = {}
    prefill = decode = memory = None
    collectives: dict[tuple[str, int], Curve] = {}
    launch_s = None

    rows = frame[(frame["op"] == "gemm") & (frame["batch"].fillna(1) == 1)]
    for precision, part in rows.groupby("precision"):
        if gemm_precisions is not None and precision not in gemm_precisions:
            continue
        predicted, _ = analytic.predict(part)
        ok, y = _log_ratio(predicted, part["latency_s"].to_numpy())
        if ok.sum() == 0:
            continue
        coords = np.log2(part[["m", "n", "k"]].to_numpy(dtype=float)[ok])
        gemm[str(precision)] = fit_surface(coords, y, GEMM_AXES, stack_label(part))

    def attention_rows(op: str) -> pd.DataFrame:
        part = frame[(frame["op"] == op) & (frame["causal"].fillna(True).astype(bool))]
        same_kv = part["kv_precision"].isna() | (part["kv_precision"] == part["precision"])
        part = part[same_kv & (part["precision"] == "bf16")]
        return part

    part = attention_rows("attention_prefill")
    part = part[part["kv_len"] == part["seq_len"]]
    if len(part):
        predicted, _ = analytic.predict(part)
        ok, y = _log_ratio(predicted, part["latency_s"].to_numpy())
        p = part[ok]
        coords = np.log2(np.column_stack([p["seq_len"], p["batch"], p["heads"], p["head_dim"]]).astype(float))
        prefill = fit_surface(coords, y, PREFILL_AXES, stack_label(part))

    part = attention_rows("attention_decode")
    part = part[part["seq_len"] == 1]
    if len(part):
        predicted, _ = analytic.predict(part)
        ok, y = _log_ratio(predicted, part["latency_s"].to_numpy())
        p = part[ok]
        coords = np.log2(np.column_stack(
            [p["kv_len"], p["batch"] * p["kv_heads"], p["head_dim"], p["heads"] / p["kv_heads"]]).astype(float))
        decode = fit_surface(coords, y, DECODE_AXES, stack_label(part))

    for (op, ranks), part in frame[frame["op"].isin(COLLECTIVE_OPS)].groupby(["op", "num_gpus"]):
        curve = latency_curve(part)
        if curve is not None:
            collectives[(str(op), int(ranks))] = curve
    custom_all_reduce = {}
    for framework, part in custom_all_reduce_rows(custom_frame).groupby("framework"):
        for ranks, group in part.groupby("num_gpus"):
            curve = latency_curve(group)
            if curve is not None:
                custom_all_reduce[(str(framework), int(ranks))] = curve

    part = frame[frame["op"].isin(["memory", "device_copy"])]
    if len(part):
        efficiency = part["bytes"].astype(float) / (part["latency_s"] * gpu.hbm_bandwidth_Bps)
        by_size = efficiency.groupby(part["bytes"].astype(float)).median()
        memory = Curve(log2_x=tuple(float(v) for v in np.log2(by_size.index.to_numpy())),
                       y=tuple(float(v) for v in by_size.to_numpy()), rows=len(part), provenance=stack_label(part))

    part = frame[frame["op"] == "launch"]
    if len(part):
        launch_s = float(part["latency_s"].median())

    return CalibrationProfile(
        gpu=gpu.name, source=source, gemm=gemm, attention_prefill=prefill, attention_decode=decode,
        memory=memory, collectives=collectives, custom_all_reduce=custom_all_reduce, launch_overhead_s=launch_s,
        gemm_clock=gemm_clock,
    )


def coverage(profile: CalibrationProfile) -> Mapping[str, str]:
    """Human-readable coverage box of every surface and curve."""
    out = {}

    def box(s: Surface) -> str:
        return ", ".join(f"{a[5:]} {2 ** g[0]:.6g}..{2 ** g[-1]:.6g}" for a, g in zip(s.axes, s.grid))

    for precision, s in profile.gemm.items():
        out[f"gemm.{precision}"] = box(s)
    if profile.attention_prefill:
        out["attention_prefill"] = box(profile.attention_prefill)
    if profile.attention_decode:
        out["attention_decode"] = box(profile.attention_decode)
    for (op, ranks), c in sorted(profile.collectives.items()):
        out[f"{op}.{ranks}"] = f"bytes {2 ** c.log2_x[0]:.6g}..{2 ** c.log2_x[-1]:.6g}"
    for (framework, ranks), c in sorted(profile.custom_all_reduce.items()):
        out[f"custom_all_reduce.{framework}.{ranks}"] = f"bytes {2 ** c.log2_x[0]:.6g}..{2 ** c.log2_x[-1]:.6g}"
    if profile.memory:
        out["memory"] = f"bytes {2 ** profile.memory.log2_x[0]:.6g}..{2 ** profile.memory.log2_x[-1]:.6g}"
    return out


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted / measured - 1.0)


_ = math
