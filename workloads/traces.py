"""Request-trace files: the Azure LLM inference trace CSV (converted and original columns) and
Mooncake-style JSONL, read into plain rows; ``workloads.requests.read_trace`` turns them into requests."""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from workloads.errors import WorkloadError

# Trace columns: converted form (microsoft/vidur data/processed_traces/splitwise_*.csv) and the
# original Azure LLM inference trace 2023 (Azure/AzurePublicDataset); see ../shared/data/traces/README.md.
_CSV_COLUMNS = (
    ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
)
# Mooncake (FAST'25) JSONL: timestamp in milliseconds, hash_ids of 512-token prompt blocks
# (../shared/reference/formulas.md, "Public request traces").
MOONCAKE_BLOCK_TOKENS = 512
_MS_TO_S = 1e-3


class TraceRow(NamedTuple):
    """One request of a trace file, times as in the file (seconds)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    session_id: int | None
    prefix_hashes: tuple[int, ...]
    prefix_block_tokens: int


def read_trace_rows(file: Path, limit: int | None) -> list[TraceRow]:
    """The first ``limit`` rows (all when None) of a CSV or JSONL (``.jsonl``/``.json``) trace."""
    try:
        return _read_jsonl(file, limit) if file.suffix in (".jsonl", ".json") else _read_csv(file, limit)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"workload.trace = '{file}' is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except csv.Error as exc:
        raise WorkloadError(f"workload.trace = '{file}' is not a well-formed CSV: {exc}") from None


# Longest request length a trace row may give (as workloads.requests.MAX_TOKENS).
_MAX_TRACE_TOKENS = 10_000_000


def _tokens(value: object, where: str, name: str) -> int:
    """A token count of a trace row: a finite number in [0, 10^7], rounded."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {name} {value!r} is not a number") from None
    if not (math.isfinite(number) and 0 <= number <= _MAX_TRACE_TOKENS):
        raise WorkloadError(f"{where}: {name} {value!r} must be a finite token count in [0, {_MAX_TRACE_TOKENS:,}]")
    return round(number)


def _timestamp_s(text: str, where: str) -> float:
    """Seconds from a number or an ISO date-time (Azure: '2023-11-16 18:15:46.6805900'; naive = UTC)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise WorkloadError(f"{where}: timestamp {text!r} must be a finite number")
        return seconds
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError:
        raise WorkloadError(f"{where}: timestamp {text!r} is neither a number nor an ISO date-time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _read_csv(file: Path, limit: int | None) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with file.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = [name.strip() for name in reader.fieldnames or ()]
        columns = next((c for c in _CSV_COLUMNS if set(c) <= set(header)), None)
        if columns is None:
            raise WorkloadError(
                f"workload.trace = '{file}': columns {header} match no known trace format; expected "
                + " or ".join(",".join(c) for c in _CSV_COLUMNS)
            )
        reader.fieldnames = header
        time_key, prompt_key, output_key = columns
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(rows) >= limit:
                break
            where = f"workload.trace = '{file}' line {line}"
            prompt, output = _tokens(row[prompt_key], where, prompt_key), _tokens(row[output_key], where, output_key)
            if row[time_key] is None:
                raise WorkloadError(f"{where}: the row has no {time_key}")
            rows.append(TraceRow(_timestamp_s(row[time_key], where), prompt, output, None, (), 16))
    return rows


def _read_jsonl(file: Path, limit: int | None) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with file.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not text.strip():
                continue
            where = f"workload.trace = '{file}' line {line}"
            try:
                record = json.loads(text)
                stamp_s = float(record["timestamp"]) * _MS_TO_S
                prompt_value, output_value = record["input_length"], record["output_length"]
                hashes = tuple(int(h) for h in record.get("hash_ids", ()))
                session = record.get("session_id", record.get("chat_id"))
                session = None if session is None else int(session)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise WorkloadError(
                    f"{where}: needs JSON with numeric timestamp (ms), input_length, output_length "
                    f"[, hash_ids]: {exc!r}"
                ) from None
            prompt = _tokens(prompt_value, where, "input_length")
            output = _tokens(output_value, where, "output_length")
            if not math.isfinite(stamp_s):
                raise WorkloadError(f"{where}: timestamp {record['timestamp']!r} must be a finite number")
            rows.append(TraceRow(stamp_s, prompt, output, session, hashes,
                         MOONCAKE_BLOCK_TOKENS))
    return rows
