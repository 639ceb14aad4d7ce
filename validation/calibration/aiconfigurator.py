"""Import the measured kernel tables of ``aiconfigurator-core`` (PyPI, Apache-2.0) into llmsim's
measurement CSV (``validation.microbench.schema``).

The package ships, per system (``aiconfigurator_core/systems/data/<system>/``), Parquet tables
collected under several serving stacks: ``gemm/<framework>/<version>/gemm_perf.parquet``,
``attention/<framework>/<version>/{context,generation}_attention_perf.parquet``,
``comm/nccl/<version>/nccl_perf.parquet``, ``comm/<framework>/<version>/custom_allreduce_perf.parquet``
(the framework's own all-reduce kernel, op ``custom_all_reduce``) and
``moe/<framework>/<version>/moe_perf.parquet``.
TensorRT-LLM's fp8 GEMM rows become the GEMM alone: each row less the dynamic activation
quantization it times, from the system's quantize tables (``without_activation_quantization``).
Latencies are milliseconds per call; NCCL ``message_size`` counts elements of ``nccl_dtype``
(the package factors it as an element count; an 8-GPU H100 all-reduce of 2^28 halves in 2.11 ms is
445 GB/s bus bandwidth, the NVLS figure, which bytes would halve); the custom all-reduce tables
count elements of ``allreduce_dtype`` the same way (from 8 Mi elements up they fall back to NCCL and
equal the NCCL table's seconds at the same count). Generation-attention ``step`` is
the number of cached tokens, so the kernel reads ``step + 1`` keys. Sliding-window rows
(``window_size`` > 0) are skipped: llmsim's attention cost has no window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from validation.microbench.schema import COLUMNS, MeasurementError

# aiconfigurator system folder -> llmsim catalog GPU (systems without a catalog entry keep gpu empty).
SYSTEM_GPUS = {
    "a100_sxm": "a100-sxm-80gb",
    "a100_pcie": "a100-pcie-80gb",
    "h100_sxm": "h100-sxm-80gb",
    "h100_pcie": "h100-pcie-80gb",
    "h200_sxm": "h200-sxm-141gb",
    "b200_sxm": "b200-sxm-180gb",
    "gb200": "gb200",
    "l40s": "l40s",
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "fp8", "float32": "fp32", "float": "fp32", "int8": "int8"}
NCCL_DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "int8": 1, "fp8": 1}
NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}
TABLE_GLOBS = (
    "gemm/*/*/gemm_perf.parquet",
    "attention/*/*/context_attention_perf.parquet",
    "attention/*/*/generation_attention_perf.parquet",
    "comm/nccl/*/nccl_perf.parquet",
    "comm/*/*/custom_allreduce_perf.parquet",
    "moe/*/*/moe_perf.parquet",
)


def _precision(series: pd.Series) -> pd.Series:
    return series.map(lambda d: DTYPES.get(d, d))


def _provenance(table: pd.DataFrame, path: Path, root: Path, system: str) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    out["device"] = table["device"].astype("string")
    out["gpu"] = SYSTEM_GPUS.get(system, pd.NA)
    out["framework"] = table["framework"].str.lower()
    out["framework_version"] = table["version"].astype(str)
    out["kernel_source"] = table["kernel_source"]
    out["source"] = f"aiconfigurator-core:{system}/{path.relative_to(root).as_posix()}"
    out["latency_s"] = table["latency"].astype(float) * 1e-3
    return out


def _gemm(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"op": "gemm", "precision": _precision(table["gemm_dtype"]), "m": table["m"],
                         "n": table["n"], "k": table["k"], "batch": 1}, index=table.index)


def _attention(table: pd.DataFrame, decode: bool) -> pd.DataFrame:
    table = table[(table["window_size"] == 0) & (table["beam_width"] == 1)]
    if decode:
        seq_len = pd.Series(1, index=table.index)
        kv_len = table["step"] + 1
    else:
        seq_len = table["isl"]
        kv_len = table["isl"] + table["step"]
    return pd.DataFrame({
        "op": "attention_decode" if decode else "attention_prefill",
        "precision": _precision(table["attn_dtype"]), "kv_precision": _precision(table["kv_cache_dtype"]),
        "batch": table["batch_size"], "seq_len": seq_len, "kv_len": kv_len, "heads": table["num_heads"],
        "kv_heads": table["num_key_value_heads"], "head_dim": table["head_dim"], "causal": True,
    }, index=table.index)


def _nccl(table: pd.DataFrame) -> pd.DataFrame:
    table = table[table["op_name"].isin(list(NCCL_OPS))]
    unknown = sorted(set(table["nccl_dtype"]) - set(NCCL_DTYPE_BYTES))
    if unknown:
        raise MeasurementError(f"nccl_dtype {unknown[0]!r} unknown; known: {', '.join(NCCL_DTYPE_BYTES)}")
    element_bytes = table["nccl_dtype"].map(NCCL_DTYPE_BYTES)
    return pd.DataFrame({
        "op": table["op_name"].map(NCCL_OPS), "precision": _precision(table["nccl_dtype"]),
        "num_gpus": table["num_gpus"], "message_bytes": table["message_size"] * element_bytes,
        "library": "nccl", "library_version": table["version"].astype(str),
    }, index=table.index)


def _custom_all_reduce(table: pd.DataFrame) -> pd.DataFrame:
    unknown = sorted(set(table["allreduce_dtype"]) - set(NCCL_DTYPE_BYTES))
    if unknown:
        raise MeasurementError(f"allreduce_dtype {unknown[0]!r} unknown; known: {', '.join(NCCL_DTYPE_BYTES)}")
    return pd.DataFrame({
        "op": "custom_all_reduce", "precision": _precision(table["allreduce_dtype"]), "num_gpus": table["num_gpus"],
        "message_bytes": table["message_size"] * table["allreduce_dtype"].map(NCCL_DTYPE_BYTES),
    }, index=table.index)


def _moe(table: pd.DataFrame) -> pd.DataFrame:
    extra = ("moe_tp=" + table["moe_tp_size"].astype(str) + ";moe_ep=" + table["moe_ep_size"].astype(str)
             + ";distribution=" + table["distribution"].astype(str))
    return pd.DataFrame({
        "op": "moe", "precision": _precision(table["moe_dtype"]), "m": table["num_tokens"],
        "n": table["inter_size"], "k": table["hidden_size"], "experts": table["num_experts"],
        "topk": table["topk"], "extra": extra,
    }, index=table.index)


def _convert(path: Path, root: Path, system: str) -> pd.DataFrame:
    table = pd.read_parquet(path)
    name = path.name
    # Older tables lack the provenance columns; the folder names them (<kind>/<framework>/<version>/).
    framework, version = path.parent.parent.name, path.parent.name
    defaults = {"framework": framework, "version": version, "device": pd.NA, "window_size": 0, "beam_width": 1, "step": 0}
    for column, value in defaults.items():
        if column not in table.columns:
            table[column] = value
    if name == "gemm_perf.parquet":
        shape = _gemm(table)
    elif name == "context_attention_perf.parquet":
        shape = _attention(table, decode=False)
    elif name == "generation_attention_perf.parquet":
        shape = _attention(table, decode=True)
    elif name == "nccl_perf.parquet":
        shape = _nccl(table)
    elif name == "custom_allreduce_perf.parquet":
        shape = _custom_all_reduce(table)
    else:
        shape = _moe(table)
    prov = _provenance(table.loc[shape.index], path, root, system)
    if name == "nccl_perf.parquet":
        # The nccl table's framework column names the harness it ran under; the library is NCCL.
        prov["framework_version"] = pd.NA
    frame = pd.concat([shape, prov], axis=1)
    return frame[frame["latency_s"] > 0]


def import_system(directory: str | Path) -> pd.DataFrame:
    """Every supported table under one system folder as measurement rows (schema column order)."""
    root = Path(directory)
    if not root.is_dir():
        raise MeasurementError(f"aiconfigurator folder {str(root)!r} does not exist or is not a folder")
    paths = sorted(p for pattern in TABLE_GLOBS for p in root.glob(pattern))
    if not paths:
        raise MeasurementError(
            f"aiconfigurator folder {str(root)!r} has no tables ({', '.join(TABLE_GLOBS)}); give one "
            "system's folder, e.g. .../aiconfigurator_core/systems/data/h100_sxm"
        )
    system = root.resolve().name
    frames = [_convert(p, root, system) for p in paths]
    frame = pd.concat(frames, ignore_index=True)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    frame = frame[list(COLUMNS)]
    for column in ("m", "n", "k", "batch", "seq_len", "kv_len", "heads", "kv_heads", "head_dim", "num_gpus",
                   "message_bytes", "bytes", "experts", "topk"):
        frame[column] = pd.to_numeric(frame[column]).astype("Int64")
    if not np.isfinite(frame["latency_s"]).all():
        raise MeasurementError(f"{root}: a table has a non-finite latency")
    for framework in QUANTIZED_GEMM_FRAMEWORKS:
        has_rows = ((frame["op"] == "gemm") & (frame["precision"] == "fp8") & (frame["framework"] == framework)).any()
        if has_rows and quantization_s(root, framework) is not None:
            frame = without_activation_quantization(frame, root, framework).reset_index(drop=True)
    return frame


def write_measurements(frame: pd.DataFrame, path: str | Path) -> None:
    """The frame as the measurement CSV (empty cells for unused columns)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = frame.copy()
    out["causal"] = out["causal"].map({True: "true", False: "false"})
    out.to_csv(path, index=False, float_format="%.9g")


# An fp8 GEMM row of the TensorRT-LLM tables times ``Linear.forward`` of TensorRT-LLM's PyTorch flow
# with weight scales only (aiconfigurator collector/trtllm/collect_gemm.py), so ``FP8QDQLinearMethod``
# quantizes the bf16 activation dynamically before the cuBLAS GEMM
# (``torch.ops.tensorrt_llm.quantize_e4m3_per_tensor``: amax, scale, cast). The package's quantize
# tables time that op at the same (m, k) (collector/trtllm/collect_computescale.py: compute_scale =
# dynamic - static quantization, scale_matrix = static), so their sum is the row's quantization.
QUANTIZE_TABLES = ("computescale_perf.parquet", "scale_matrix_perf.parquet")
# Stacks whose fp8 GEMM rows ``import_system`` converts to the GEMM alone where the system has their
# quantize tables (llmsim's gemm op is the kernel; training prices its casts as ops of their own).
# Only TensorRT-LLM's were checked: subtracted, its H100/H200 8192^3 GEMMs run 1,510-1,553 TFLOP/s;
# SGLang's quantize tables time more than its whole fp8 GEMM rows at many shapes (not the same op).
QUANTIZED_GEMM_FRAMEWORKS = ("trtllm",)
# Rows whose GEMM is under this fraction of the timed call are dominated by the quantization
# (n of 32..512 with k up to 65,536): the difference of two measurements is noise there; dropped.
MIN_GEMM_FRACTION = 0.25


def quantization_s(directory: str | Path, framework: str) -> pd.Series | None:
    """Seconds of the dynamic per-tensor fp8 activation quantization by (m, k) in one system's
    quantize tables of ``framework`` (newest version), or None without them."""
    versions = sorted((Path(directory) / "quantize" / framework).glob("*/"), key=lambda p: p.name)
    if not versions or not all((versions[-1] / name).is_file() for name in QUANTIZE_TABLES):
        return None
    total = None
    for name in QUANTIZE_TABLES:
        table = pd.read_parquet(versions[-1] / name)
        part = table[table["quant_dtype"] == "fp8"].groupby(["m", "k"])["latency"].median() * 1e-3
        total = part if total is None else total.add(part, fill_value=0.0)
    return total


def without_activation_quantization(frame: pd.DataFrame, directory: str | Path, framework: str) -> pd.DataFrame:
    """``frame`` with ``framework``'s fp8 GEMM rows timing the GEMM kernel alone: each row's
    activation quantization (``quantization_s`` at its m, k) subtracted, rows without a quantize
    measurement or left under ``MIN_GEMM_FRACTION`` of the call dropped. Raises when the system has
    no quantize tables for the framework."""
    quant = quantization_s(directory, framework)
    if quant is None:
        raise MeasurementError(f"{directory}: no quantize/{framework} tables ({', '.join(QUANTIZE_TABLES)})")
    rows = (frame["op"] == "gemm") & (frame["precision"] == "fp8") & (frame["framework"] == framework)
    part = frame[rows]
    keys = pd.MultiIndex.from_arrays([part["m"].astype(int), part["k"].astype(int)])
    q = quant.reindex(keys).to_numpy()
    gemm_s = part["latency_s"].to_numpy() - q
    keep = np.isfinite(q) & (gemm_s >= MIN_GEMM_FRACTION * part["latency_s"].to_numpy())
    part = part[keep].copy()
    part["latency_s"] = gemm_s[keep]
    part["source"] = part["source"] + " less quantize_e4m3_per_tensor (quantize tables)"
    return pd.concat([frame[~rows], part]).sort_index()

