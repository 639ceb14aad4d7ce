"""Config files: TOML loading, ``--set`` overrides, and the sections every run shares
(``[model]`` and ``[cluster]``). ``[training]``/``[parallel]`` and ``[serving]``/``[workload]``/``[slo]``
are parsed by ``sim.training`` and ``sim.serving``.
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Mapping

from hardware.calibration import load_profile
from hardware.catalog import get_gpu, get_network, get_node
from hardware.errors import CatalogError
from hardware.specs import GpuSpec
from hardware.topology import Cluster, build_cluster
from sim.errors import ConfigError
from sim.notices import warn
from workloads.catalog import default_models, get_model, model_from_mapping
from workloads.errors import ModelCatalogError
from workloads.model import ModelSpec

KNOWN_SECTIONS = ("model", "cluster", "training", "parallel", "serving", "workload", "slo", "search", "published")


def parse_value(text: str) -> Any:
    """A --set value as TOML would read it (int, float, bool, string, list); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def apply_override(config: dict[str, Any], assignment: str) -> None:
    """Apply one ``KEY=VALUE`` with a dotted KEY (``parallel.tp=4``) in place."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set '{assignment}' must look like section.key=value")
    parts = key.strip().split(".")
    if parts[0] not in KNOWN_SECTIONS:
        raise ConfigError(f"--set '{assignment}': unknown section '{parts[0]}'; known: {', '.join(KNOWN_SECTIONS)}")
    table = config
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ConfigError(f"--set '{assignment}': '{part}' is not a table")
    table[parts[-1]] = parse_value(text.strip())


def load_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a TOML config and apply ``--set`` overrides; checks only the section names."""
    return with_overrides(read_toml(path, "config file"), overrides or [])


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """A TOML file as a dict; a missing file, a folder, bytes that are not UTF-8, malformed or absurdly
    nested TOML raise ConfigError naming the file."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{what} '{path}' is a folder, not a TOML file")
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} '{path}' not found") from None
    except OSError as exc:
        raise ConfigError(f"{what} '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} '{path}' is not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}); "
            "save it as UTF-8, as TOML requires"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} '{path}' is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what} '{path}' nests tables or arrays too deeply to read") from None


def with_overrides(config: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A deep copy of ``config`` with each ``KEY=VALUE`` applied, then the section names checked."""
    try:
        result = copy.deepcopy(dict(config))
    except RecursionError:
        raise ConfigError("the config nests tables or arrays too deeply") from None
    for assignment in overrides:
        apply_override(result, assignment)
    unknown = sorted(set(result) - set(KNOWN_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config sections {unknown}; known: {', '.join(KNOWN_SECTIONS)}")
    return result


def section(config: Mapping[str, Any], name: str, required: bool = True) -> dict[str, Any]:
    """The table ``[name]`` (empty if optional and absent)."""
    if name not in config:
        if required:
            raise ConfigError(f"config has no [{name}] section")
        return {}
    table = config[name]
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}] must be a table, got {table!r}")
    return dict(table)


def reject_unknown_keys(table: Mapping[str, Any], name: str, allowed: tuple[str, ...] | list[str]) -> None:
    """Raise ConfigError naming the first key of ``[name]`` that is not in ``allowed``."""
    for key in table:
        if key not in allowed:
            raise ConfigError(f"[{name}] unknown key '{key}'; allowed: {', '.join(allowed)}")


INLINE_MODEL_NAME = "custom"


def resolve_model(config: Mapping[str, Any], default_max_seq_len: int | None = None) -> ModelSpec:
    """``[model]``: a catalog ``name`` alone, or an inline architecture; an inline one needs no
    ``name`` (default "custom") and, given ``default_max_seq_len`` (the run's sequence length), no
    ``max_seq_len``."""
    table = section(config, "model")
    if not table:
        raise ConfigError("[model] needs 'name' (a catalog model) or an inline architecture (layers, hidden, ...)")
    if "name" in table and not isinstance(table["name"], str):
        raise ConfigError(f"[model] name = {table['name']!r} must be a string (a catalog model, see `llmsim catalog models`)")
    try:
        if set(table) == {"name"}:
            try:
                return get_model(str(table["name"]))
            except ModelCatalogError as exc:
                raise ConfigError(f"[model] name: {exc}") from None
        inline = dict(table)
        inline.setdefault("name", INLINE_MODEL_NAME)
        if default_max_seq_len is not None:
            inline.setdefault("max_seq_len", default_max_seq_len)
        return model_from_mapping(inline, "[model]")
    except ModelCatalogError as exc:
        message, name = str(exc), table.get("name")
        if "missing key" in message and name in default_models():
            other = ", ".join(sorted(set(table) - {"name"}))
            message += (f" (name = {name!r} is a catalog model: give the name alone to use it; with other keys "
                        f"({other}) [model] is a whole inline architecture)")
        raise ConfigError(message) from None


MAX_NUM_GPUS = 1_000_000  # the largest clusters built are ~10^5 GPUs; the topology graph grows with it
CLUSTER_KEYS = ("gpu", "num_gpus", "node", "network", "calibration", "groups")
# ``[cluster] calibration = "none"``: no profile, the analytic cost model alone
NO_CALIBRATION = "none"


def with_calibration(gpu: GpuSpec, path: Any) -> GpuSpec:
    """``gpu`` priced with the calibration profile at ``path`` (``[cluster] calibration``; relative
    paths resolve from the working directory) instead of its shipped profile; ``"none"`` prices it
    with the analytic defaults alone."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"[cluster] calibration = {path!r} must be the path of a profile TOML (llmsim calibrate fit) or \"none\""
        )
    if path == NO_CALIBRATION:
        return dataclasses.replace(gpu, calibration=None)
    try:
        profile = load_profile(path)
    except CatalogError as exc:
        raise ConfigError(f"[cluster] calibration: {exc}") from None
    return dataclasses.replace(gpu, calibration=profile)


def resolve_cluster(config: Mapping[str, Any], default_num_gpus: int | None = None) -> Cluster:
    """``[cluster]``: GPU (catalog name), GPU count, and optionally node and network names."""
    table = section(config, "cluster")
    reject_unknown_keys(table, "cluster", CLUSTER_KEYS)
    if "groups" in table:
        raise ConfigError("[cluster] groups (a heterogeneous cluster) is for training runs; give one gpu and num_gpus for serving")
    if "gpu" not in table:
        raise ConfigError("[cluster] needs 'gpu' (a catalog GPU name; see `llmsim catalog gpus`)")
    num_gpus = table.get("num_gpus", default_num_gpus)
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus <= 0:
        raise ConfigError(f"[cluster] num_gpus = {num_gpus!r} must be a positive integer")
    if num_gpus > MAX_NUM_GPUS:
        raise ConfigError(f"[cluster] num_gpus = {num_gpus} is past the limit {MAX_NUM_GPUS:,}")
    try:
        gpu = get_gpu(str(table["gpu"]))
        if "calibration" in table:
            gpu = with_calibration(gpu, table["calibration"])
        node = get_node(str(table.get("node", gpu.default_node)))
        network = get_network(str(table.get("network", node.default_network)))
    except CatalogError as exc:
        raise ConfigError(f"[cluster] {exc}") from None
    if node.gpu != gpu.name:
        raise ConfigError(f"[cluster] node '{node.name}' holds {node.gpu}, not gpu '{gpu.name}'")
    return build_cluster(gpu, node, network, num_gpus)


# When the default 16-bit format is missing on a GPU (bf16 before Ampere), the other one stands in.
_PRECISION_STAND_INS = {"bf16": "fp16", "fp16": "bf16"}


def supported_precision(precision: str, gpu: Any, where: str, *, given: bool) -> str:
    """``precision`` if ``gpu`` has a dense peak for it. A default the GPU lacks is replaced by the
    other 16-bit format, with a warning; a precision the user gave is an error listing what exists."""
    peaks = gpu.peak_flops_per_s
    if precision in peaks:
        return precision
    have = ", ".join(p for p in peaks)
    stand_in = _PRECISION_STAND_INS.get(precision)
    if not given and stand_in in peaks:
        warn(f"{where} defaults to {precision}, which gpu {gpu.name} has no peak for (it has {have}); using {stand_in}")
        return stand_in
    usable = [p for p in ("bf16", "fp16", "fp8") if p in peaks]
    hint = f"; use {where} = '{usable[0]}'" if usable else ""
    raise ConfigError(f"{where} = '{precision}': gpu {gpu.name} has no {precision} peak (it has {have}){hint}")
