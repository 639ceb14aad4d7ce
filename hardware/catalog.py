"""Load the hardware catalog (``hardware/catalog/{gpus,nodes,networks}/*.toml``).

Catalog files state human units in their key names (``hbm_bandwidth_GBps = 2039``); this module is
the one place they are converted to SI. Unknown keys, missing keys and duplicate names raise
``CatalogError`` naming the file, so a typo can never be silently ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

from hardware import units
from hardware.calibration import shipped_profile
from hardware.errors import CatalogError
from hardware.specs import (
    EfficiencySpec,
    GpuSpec,
    HardwareCatalog,
    NetworkSpec,
    NicSpec,
    NodeSpec,
    Precision,
    frozen_mapping,
)

CATALOG_DIR = Path(__file__).parent / "catalog"

# Suffix -> factor to SI, per kind of quantity. A key ``<field>_<suffix>`` gives the field in that unit.
_BYTES = {"bytes": 1.0, "GB": units.GB, "GiB": units.GiB, "MB": units.MB, "MiB": units.MiB, "TB": units.TB, "TiB": units.TiB}
_RATE = {"Bps": 1.0, "GBps": units.GBps, "Gbps": units.Gbps}
_TIME = {"s": 1.0, "us": units.us, "ns": units.ns, "ms": units.ms}
_FREQ = {"Hz": 1.0, "MHz": units.MHz, "GHz": units.GHz}


class _Table:
    """A TOML table being consumed: every key must be used exactly once."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self._data = dict(data)
        self._where = where

    def take(self, key: str, kind: type | tuple[type, ...] = object, default: Any = ...) -> Any:
        if key not in self._data:
            if default is ...:
                raise CatalogError(f"{self._where}: missing key '{key}'")
            return default
        value = self._data.pop(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind):
            raise CatalogError(f"{self._where}: key '{key}' = {value!r} must be {kind}")
        return value

    def quantity(self, field: str, suffixes: Mapping[str, float], default: float | None = None) -> float:
        """The field given as ``<field>_<unit>`` in exactly one of the allowed units, in SI."""
        present = [s for s in suffixes if f"{field}_{s}" in self._data]
        if len(present) > 1:
            raise CatalogError(f"{self._where}: '{field}' given in several units: {present}")
        if not present:
            if default is None:
                allowed = ", ".join(f"{field}_{s}" for s in suffixes)
                raise CatalogError(f"{self._where}: missing '{field}' (one of {allowed})")
            return default
        value = self.take(f"{field}_{present[0]}", (int, float))
        if value < 0:
            raise CatalogError(f"{self._where}: '{field}_{present[0]}' = {value} must be >= 0")
        return float(value) * suffixes[present[0]]

    def sub(self, key: str, optional: bool = False) -> _Table | None:
        if optional and key not in self._data:
            return None
        return _Table(self.take(key, dict), f"{self._where} [{key}]")

    def done(self) -> None:
        if self._data:
            raise CatalogError(f"{self._where}: unknown keys {sorted(self._data)}")


def _check_memory_total(gpu: str, field: str, value: float | None, source: str, ceiling: float, ceiling_name: str) -> None:
    """A memory total some software reports (``field``, None when not given) fits under ``ceiling``
    and names its source."""
    if value is None:
        return
    if value > ceiling:
        raise CatalogError(f"gpu {gpu}: {field} = {value / units.MiB:g} MiB must be at most {ceiling_name} = {ceiling / units.MiB:g} MiB")
    if not source:
        raise CatalogError(f"gpu {gpu}: {field} needs {field}_source")


def _gpu(t: _Table) -> GpuSpec:
    peaks = t.sub("peak_TFLOPS")
    assert peaks is not None
    peak_flops: dict[str, float] = {}
    for precision in Precision:
        value = peaks.take(precision.value, float, default=None)
        if value is not None:
            peak_flops[precision.value] = value * units.TFLOPS
    peaks.done()
    eff = t.sub("efficiency")
    assert eff is not None
    efficiency = EfficiencySpec(
        gemm=eff.take("gemm", float),
        attention=eff.take("attention", float),
        memory=eff.take("memory", float),
        launch_overhead_s=eff.quantity("launch_overhead", _TIME),
        source=eff.take("source", str),
        gemm_memory=eff.take("gemm_memory", float, default=None),
        gemm_fp8=eff.take("gemm_fp8", float, default=None),
        gemm_fp8_fast_accumulation=eff.take("gemm_fp8_fast_accumulation", float, default=1.0),
        memory_kernels=eff.take("memory_kernels", float, default=1.0),
    )
    eff.done()
    price = t.sub("price", optional=True)
    price_usd = price_source = None
    if price is not None:
        price_usd = price.take("usd_per_hour", float)
        price_source = price.take("source", str)
        price.done()
    spec = GpuSpec(
        name=t.take("name", str),
        vendor=t.take("vendor", str),
        peak_flops_per_s=frozen_mapping(peak_flops),
        hbm_capacity_bytes=t.quantity("hbm_capacity", _BYTES),
        hbm_bandwidth_Bps=t.quantity("hbm_bandwidth", _RATE),
        memory_type=t.take("memory_type", str),
        sm_count=t.take("sm_count", int),
        boost_clock_Hz=t.quantity("boost_clock", _FREQ),
        l2_cache_bytes=t.quantity("l2_cache", _BYTES),
        l2_bandwidth_Bps=t.quantity("l2_bandwidth", _RATE, default=0.0),
        nvlink_bandwidth_Bps=t.quantity("nvlink_bandwidth", _RATE),
        pcie_generation=t.take("pcie_generation", int),
        pcie_lanes=t.take("pcie_lanes", int),
        tdp_W=t.take("tdp_W", float),
        default_node=t.take("default_node", str),
        efficiency=efficiency,
        price_per_hour_usd=price_usd,
        price_source=price_source,
        source=t.take("source", str),
        notes=t.take("notes", str, default=""),
        architecture=t.take("architecture", str, default=None),
        sustained_clock_Hz=t.quantity("sustained_clock", _FREQ, default=0.0) or None,
        sustained_clock_source=t.take("sustained_clock_source", str, default=""),
        reported_memory_bytes=t.quantity("reported_memory", _BYTES, default=0.0) or None,
        reported_memory_source=t.take("reported_memory_source", str, default=""),
        runtime_memory_bytes=t.quantity("runtime_memory", _BYTES, default=0.0) or None,
        runtime_memory_source=t.take("runtime_memory_source", str, default=""),
    )
    t.done()
    _check_memory_total(spec.name, "reported_memory", spec.reported_memory_bytes, spec.reported_memory_source,
                        spec.hbm_capacity_bytes, "hbm_capacity")
    _check_memory_total(spec.name, "runtime_memory", spec.runtime_memory_bytes, spec.runtime_memory_source,
                        spec.driver_memory_bytes, "the driver's total (reported_memory, else hbm_capacity)")
    if not 0.0 < spec.efficiency.memory_kernels <= 1.0:
        raise CatalogError(f"gpu {spec.name}: efficiency.memory_kernels = {spec.efficiency.memory_kernels:g} must be in (0, 1] "
                           "(the memory-bound kernels' rate over the STREAM rate efficiency.memory)")
    if spec.sustained_clock_Hz is not None:
        if not 0.0 < spec.sustained_clock_Hz <= spec.boost_clock_Hz:
            raise CatalogError(
                f"gpu {spec.name}: sustained_clock = {spec.sustained_clock_Hz / 1e6:g} MHz must be in (0, boost_clock "
                f"= {spec.boost_clock_Hz / 1e6:g} MHz]"
            )
        if not spec.sustained_clock_source:
            raise CatalogError(f"gpu {spec.name}: sustained_clock_MHz needs sustained_clock_source")
    # The calibration profile fitted from public measurements for this GPU, if one ships
    # (hardware/calibration_profiles/<name>.toml); read on first use.
    return dataclasses.replace(spec, calibration=shipped_profile(spec.name))


def _node(t: _Table) -> NodeSpec:
    nics = t.sub("nics")
    assert nics is not None
    nic_spec = NicSpec(
        count=nics.take("count", int),
        bandwidth_Bps=nics.quantity("bandwidth", _RATE),
        gpu_affinity=tuple(tuple(int(g) for g in group) for group in nics.take("gpu_affinity", list)),
    )
    nics.done()
    spec = NodeSpec(
        name=t.take("name", str),
        gpu=t.take("gpu", str),
        gpus_per_node=t.take("gpus_per_node", int),
        intra_node_fabric=t.take("intra_node_fabric", str),
        intra_node_bandwidth_Bps=t.quantity("intra_node_bandwidth", _RATE),
        intra_node_latency_s=t.quantity("intra_node_latency", _TIME),
        nvlink_domain_gpus=t.take("nvlink_domain_gpus", int),
        nvls=t.take("nvls", bool),
        nics=nic_spec,
        cpu_dram_capacity_bytes=t.quantity("cpu_dram_capacity", _BYTES),
        cpu_dram_bandwidth_Bps=t.quantity("cpu_dram_bandwidth", _RATE),
        host_to_device_Bps=t.quantity("host_to_device", _RATE),
        device_to_host_Bps=t.quantity("device_to_host", _RATE),
        gpus_per_pcie_switch=t.take("gpus_per_pcie_switch", int),
        nvme_capacity_bytes=t.quantity("nvme_capacity", _BYTES),
        nvme_read_Bps=t.quantity("nvme_read", _RATE),
        nvme_write_Bps=t.quantity("nvme_write", _RATE),
        gpudirect_storage=t.take("gpudirect_storage", bool),
        default_network=t.take("default_network", str),
        source=t.take("source", str),
        notes=t.take("notes", str, default=""),
        intra_node_efficiency=_fraction(t, "intra_node_efficiency"),
        nvls_efficiency=_fraction(t, "nvls_efficiency"),
    )
    t.done()
    return spec


def _fraction(t: _Table, key: str) -> float | None:
    """An optional achievable fraction of a link's bandwidth; it must lie in (0, 1]."""
    value = t.take(key, float, default=None)
    if value is not None and not 0.0 < value <= 1.0:
        raise CatalogError(f"{t._where}: '{key}' = {value} must be in (0, 1]")
    return value


def _network(t: _Table) -> NetworkSpec:
    spec = NetworkSpec(
        name=t.take("name", str),
        topology=t.take("topology", str),
        link_bandwidth_Bps=t.quantity("link_bandwidth", _RATE),
        per_hop_latency_s=t.quantity("per_hop_latency", _TIME),
        endpoint_latency_s=t.quantity("endpoint_latency", _TIME),
        oversubscription=t.take("oversubscription", float),
        nodes_per_leaf=t.take("nodes_per_leaf", int),
        efficiency=t.take("efficiency", float),
        source=t.take("source", str),
        notes=t.take("notes", str, default=""),
    )
    t.done()
    return spec


def _load_dir(directory: Path, parse: Callable[[_Table], Any]) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for path in sorted(directory.glob("*.toml")):
        where = f"{directory.parent.name}/{directory.name}/{path.name}"
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{where}: invalid TOML: {exc}") from None
        spec = parse(_Table(data, where))
        if spec.name in entries:
            raise CatalogError(f"{where}: duplicate name '{spec.name}'")
        entries[spec.name] = spec
    return entries


def load_catalog(directory: Path | str = CATALOG_DIR) -> HardwareCatalog:
    """Read every GPU, node and network entry under ``directory`` and check cross-references."""
    root = Path(directory)
    catalog = HardwareCatalog(
        gpus=_load_dir(root / "gpus", _gpu),
        nodes=_load_dir(root / "nodes", _node),
        networks=_load_dir(root / "networks", _network),
    )
    for node in catalog.nodes.values():
        if node.gpu not in catalog.gpus:
            raise CatalogError(f"node {node.name}: unknown gpu '{node.gpu}'")
        if node.default_network not in catalog.networks:
            raise CatalogError(f"node {node.name}: unknown default_network '{node.default_network}'")
    for gpu in catalog.gpus.values():
        if gpu.default_node not in catalog.nodes:
            raise CatalogError(f"gpu {gpu.name}: unknown default_node '{gpu.default_node}'")
    return catalog


@functools.cache
def default_catalog() -> HardwareCatalog:
    """The bundled catalog, loaded on first use."""
    return load_catalog(CATALOG_DIR)


def _lookup(kind: str, entries: Mapping[str, Any], name: str) -> Any:
    try:
        return entries[name]
    except KeyError:
        raise CatalogError(f"unknown {kind} '{name}'; known: {', '.join(sorted(entries))}") from None


def get_gpu(name: str) -> GpuSpec:
    return _lookup("gpu", default_catalog().gpus, name)


def get_node(name: str) -> NodeSpec:
    return _lookup("node", default_catalog().nodes, name)


def analytic_gpu(name: str) -> GpuSpec:
    """The catalog GPU without its calibration profile: the analytic defaults alone."""
    return dataclasses.replace(get_gpu(name), calibration=None)


def get_network(name: str) -> NetworkSpec:
    return _lookup("network", default_catalog().networks, name)
