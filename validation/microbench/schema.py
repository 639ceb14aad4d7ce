"""The measurement CSV: one schema for the harness (``llmsim calibrate run``) and the importers.

One row is one timed kernel (or collective) with its shape, the seconds it took on the device and
where the number came from. Shape columns an op does not use are empty. Columns:

- ``op``: gemm, attention_prefill, attention_decode, all_reduce, all_gather, reduce_scatter,
  all_to_all, memory, device_copy, host_to_device, device_to_host, launch, moe;
- ``precision``: bf16, fp16, fp8, fp32, ... (the compute format; imported dtypes outside llmsim's
  precisions keep their own name, e.g. ``fp8_block``); ``kv_precision`` for attention KV caches;
- GEMM ``m, n, k, batch`` (C[m, n] = A[m, k] B[k, n]); attention ``batch`` sequences of ``seq_len``
  new query tokens over ``kv_len`` keys (kv_len > seq_len: prefill with existing KV; seq_len 1:
  decode), ``heads``, ``kv_heads``, ``head_dim``, ``causal``; collectives ``num_gpus`` and
  ``message_bytes`` (nccl-tests convention: full buffer for all-reduce, gathered output for
  all-gather, input for reduce-scatter, per-rank send buffer for all-to-all); memory and copies
  ``bytes`` moved (read + write); MoE ``m`` tokens, ``n`` expert intermediate size, ``k`` hidden,
  ``experts``, ``topk``, and ``extra`` (key=value;... for anything else);
- ``latency_s``: device seconds of one call (median of repeats for the harness);
- provenance: ``device`` (as the driver names it), ``gpu`` (llmsim catalog name when known),
  ``driver``, ``cuda``, ``torch``, ``library`` and ``library_version`` (e.g. nccl 2.23),
  ``framework`` and ``framework_version`` (the stack the table was collected under),
  ``kernel_source``, ``source`` (harness, or the file a row was imported from), ``date``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from hardware.errors import CatalogError

OPS = (
    "gemm",
    "attention_prefill",
    "attention_decode",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "custom_all_reduce",  # a serving framework's own all-reduce kernel (framework column: which)
    "memory",
    "device_copy",
    "host_to_device",
    "device_to_host",
    "launch",
    "moe",
)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

SHAPE_COLUMNS = (
    "m", "n", "k", "batch", "seq_len", "kv_len", "heads", "kv_heads", "head_dim", "causal",
    "num_gpus", "message_bytes", "bytes", "experts", "topk",
)
PROVENANCE_COLUMNS = (
    "device", "gpu", "driver", "cuda", "torch", "library", "library_version", "framework",
    "framework_version", "kernel_source", "source", "date",
)
COLUMNS = ("op", "precision", "kv_precision", *SHAPE_COLUMNS, "extra", "latency_s", *PROVENANCE_COLUMNS)
INTEGER_COLUMNS = tuple(c for c in SHAPE_COLUMNS if c != "causal")


class MeasurementError(CatalogError):
    """A measurement row or file that does not follow the schema (bad input: one-line error, exit 2)."""


def check_row(row: Mapping[str, Any]) -> None:
    """Raise ``MeasurementError`` for unknown columns, an unknown op or a non-positive latency."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise MeasurementError(f"unknown measurement columns {sorted(unknown)}; allowed: {', '.join(COLUMNS)}")
    if row.get("op") not in OPS:
        raise MeasurementError(f"op = {row.get('op')!r}; allowed: {', '.join(OPS)}")
    latency = row.get("latency_s")
    if not isinstance(latency, (int, float)) or not math.isfinite(latency) or latency <= 0:
        raise MeasurementError(f"{row['op']} row: latency_s = {latency!r} must be a positive number of seconds")


def write_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write rows (dicts with a subset of ``COLUMNS``) as the measurement CSV; returns the count."""
    count = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            check_row(row)
            writer.writerow({c: _cell(row.get(c)) for c in COLUMNS})
            count += 1
    return count


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return value


def read_csv(path: str | Path):
    """The measurement CSV as a pandas DataFrame with every schema column (missing ones empty);
    integer shape columns as nullable integers, ``causal`` as booleans. ``MeasurementError`` when
    the file lacks ``op`` or ``latency_s`` or has an unknown op."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        raise MeasurementError(f"measurements file {str(path)!r} is a folder, not a CSV file")
    try:
        frame = pd.read_csv(path, dtype={c: "string" for c in PROVENANCE_COLUMNS + ("op", "precision", "kv_precision", "extra", "causal")})
    except FileNotFoundError:
        raise MeasurementError(f"measurements file {str(path)!r} does not exist") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise MeasurementError(f"measurements file {str(path)!r} is not a CSV: {exc}") from None
    for required in ("op", "latency_s"):
        if required not in frame.columns:
            raise MeasurementError(f"measurements file {str(path)!r} has no '{required}' column; columns: {', '.join(COLUMNS)}")
    bad_ops = sorted(set(frame["op"].dropna()) - set(OPS))
    if bad_ops:
        raise MeasurementError(f"measurements file {str(path)!r}: op {bad_ops[0]!r} unknown; allowed: {', '.join(OPS)}")
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    for column in INTEGER_COLUMNS:
        frame[column] = _numbers(frame[column], path, integer=True).astype("Int64")
    frame["causal"] = frame["causal"].map({True: True, False: False, "true": True, "false": False, "True": True, "False": False})
    frame["latency_s"] = _numbers(frame["latency_s"], path, integer=False).astype(float)
    if not (frame["latency_s"].between(0, float("inf"), inclusive="neither")).all():
        raise MeasurementError(f"measurements file {str(path)!r}: latency_s must be > 0 and finite on every row")
    return frame[list(COLUMNS)]


def _numbers(column, path: Path, *, integer: bool):  # type: ignore[no-untyped-def]
    """A CSV column as numbers; ``MeasurementError`` naming the column, the data row and the value
    of the first entry that is not a number (or, for shape columns, not a whole number)."""
    import pandas as pd

    values = pd.to_numeric(column, errors="coerce")
    bad = column.notna() & values.isna()
    if integer:
        bad |= values.notna() & ((values != values.round()) | (values.abs() == float("inf")))
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        kind = "an integer" if integer else "a number"
        raise MeasurementError(
            f"measurements file {str(path)!r}: {column.name} = '{column.iloc[row]}' on data row {row + 1} is not {kind}"
        )
    return values
