"""Catalog listings and single entries for the CLI: JSON objects in SI units, tables in human units."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from hardware import units
from hardware.catalog import default_catalog
from hardware.errors import CatalogError
from hardware.calibration import CalibrationProfile, ShippedProfile
from hardware.specs import GpuSpec, NetworkSpec, NodeSpec
from workloads.catalog import default_models
from workloads.model import ModelSpec

Entry = GpuSpec | NodeSpec | NetworkSpec | ModelSpec


def _plain(value: Any) -> Any:
    """JSON-ready copy: dataclasses and mappings become dicts, tuples become lists; a calibration
    profile becomes its description (file and GPU), not its tables."""
    if isinstance(value, (CalibrationProfile, ShippedProfile)):
        return value.describe()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _entries(kind: str) -> Mapping[str, Entry]:
    if kind == "models":
        return default_models()
    return getattr(default_catalog(), kind)


def entry_json(entry: Entry) -> dict[str, Any]:
    """All fields in SI units; models add their derived parameter counts."""
    data = _plain(entry)
    if isinstance(entry, ModelSpec):
        data["total_parameters"] = entry.total_parameters()
        data["active_parameters"] = entry.active_parameters()
    return data


def list_json(kind: str) -> list[dict[str, Any]]:
    return [entry_json(e) for e in _entries(kind).values()]


def find_entry(name: str) -> Entry:
    """The GPU, node, network or model called ``name``."""
    for kind in ("gpus", "nodes", "networks", "models"):
        entries = _entries(kind)
        if name in entries:
            return entries[name]
    known = sorted(n for kind in ("gpus", "nodes", "networks", "models") for n in _entries(kind))
    raise CatalogError(f"unknown catalog entry '{name}'; known: {', '.join(known)}")


def _format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def list_table(kind: str) -> str:
    entries = list(_entries(kind).values())
    if kind == "gpus":
        header = ["name", "bf16 TFLOP/s", "HBM GiB", "HBM GB/s", "SMs", "NVLink GB/s/dir", "source"]
        rows = [
            [
                g.name,
                f"{g.peak_flops_per_s.get('bf16', g.peak_flops_per_s.get('fp16', 0.0)) / units.TFLOPS:.0f}",
                f"{g.hbm_capacity_bytes / units.GiB:.1f}",
                f"{g.hbm_bandwidth_Bps / units.GBps:.0f}",
                str(g.sm_count),
                f"{g.nvlink_bandwidth_Bps / units.GBps:.0f}",
                _short(g.source),
            ]
            for g in entries
        ]
    elif kind == "nodes":
        header = ["name", "gpu", "gpus", "fabric", "GB/s/dir", "NICs", "network", "source"]
        rows = [
            [
                n.name,
                n.gpu,
                str(n.gpus_per_node),
                n.intra_node_fabric,
                f"{n.intra_node_bandwidth_Bps / units.GBps:.0f}",
                f"{n.nics.count}x{n.nics.bandwidth_Bps / units.Gbps:.0f}Gb/s",
                n.default_network,
                _short(n.source, 40),
            ]
            for n in entries
        ]
    elif kind == "networks":
        header = ["name", "topology", "Gb/s/port", "hop ns", "oversub", "source"]
        rows = [
            [
                n.name,
                n.topology,
                f"{n.link_bandwidth_Bps / units.Gbps:.0f}",
                f"{n.per_hop_latency_s / units.ns:.0f}",
                f"{n.oversubscription:g}",
                _short(n.source),
            ]
            for n in entries
        ]
    else:
        header = ["name", "params (B)", "active (B)", "layers", "hidden", "heads", "kv", "ffn", "experts", "source"]
        rows = [
            [
                m.name,
                f"{m.total_parameters() / 1e9:.2f}",
                f"{m.active_parameters() / 1e9:.2f}",
                str(m.layers),
                str(m.hidden),
                str(m.heads),
                str(m.kv_heads),
                str(m.ffn_hidden),
                f"{m.experts_per_token}/{m.experts}" if m.is_moe else "-",
                _short(m.source, 40),
            ]
            for m in entries
        ]
    return _format_table(header, rows)


# Human rendering of SI fields, by name suffix.
_HUMAN = (
    ("_bytes", units.GiB, "GiB"),
    ("_Bps", units.GBps, "GB/s"),
    ("_s", units.us, "us"),
    ("_Hz", units.MHz, "MHz"),
)


# Fields whose zero or None means "no source gives a value" (the model then falls back, see hardware/).
_UNSET_WHEN_ZERO = {"l2_bandwidth_Bps": "not set (not measured; GEMM partial sums go through HBM)"}
_UNSET_NOTES = {"gemm_memory": "not set (weight streaming uses efficiency.memory)"}


def _human(name: str, value: Any) -> str:
    if value is None or value == "":
        return _UNSET_NOTES.get(name, "not set")
    if name in _UNSET_WHEN_ZERO and value == 0:
        return _UNSET_WHEN_ZERO[name]
    if name == "nvlink_bandwidth_Bps" and value == 0:
        return "none (no NVLink)"
    if isinstance(value, float):
        if name == "peak_flops_per_s":
            return f"{value / units.TFLOPS:g} TFLOP/s"
        if name.endswith("_bytes") and value < units.GiB:
            return f"{value / units.MiB:g} MiB"
        for suffix, factor, unit in _HUMAN:
            if name.endswith(suffix):
                return f"{value / factor:g} {unit}"
    return str(value)


def entry_table(entry: Entry) -> str:
    """``field  value unit`` lines, nested tables flattened with dots."""
    lines: list[str] = []

    def walk(prefix: str, data: Mapping[str, Any], leaf_name: str = "") -> None:
        for key, value in data.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value, leaf_name=key)
            else:
                unit_key = leaf_name if prefix and leaf_name == "peak_flops_per_s" else key
                lines.append(f"{name:<40} {_human(unit_key, value)}")

    walk("", entry_json(entry))
    return "\n".join(lines)
