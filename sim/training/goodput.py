"""Checkpointing and failures as goodput: the training-time cost of saving state and of losing the
work since the last durable checkpoint, in closed form from one iteration's metrics.

Conventions (each cited where it is used):
* A checkpoint holds the 16-bit weights and the optimizer state of every parameter once (replicas
  de-duplicated, every rank writing its share in parallel, as Megatron's distributed checkpointing
  and PyTorch DCP do): Psi (2 + 12) bytes with Adam (fp32 master weight, m, v), Psi (2 + 4) with SGD.
* ``sync``: training stops until every node has written its share to storage at
  ``storage_Bps_per_node``. ``async``: training stops only while each GPU copies its share to host
  memory (over its share of the PCIe switch uplink, all GPUs at once); the flush to storage runs in
  the background and the checkpoint is durable when it ends (CheckFreq, Mohan et al. FAST'21: snapshot
  then persist; Nebula / DataStates-LLM lazy asynchronous snapshots). A flush longer than the
  interval stalls the next checkpoint by the excess.
* Failures arrive as a Poisson process with the job's MTBF = per-GPU (or per-node) MTBF / the job's
  GPUs (nodes). Each failure loses the work since the last durable checkpoint, on average half an
  interval plus the flush latency, and the restart time. Waste fraction (Young 1974, first order):
  stall / interval + (interval / 2 + flush latency + restart) / MTBF; goodput = throughput x
  (1 - waste). Optimal interval: Young's sqrt(2 stall MTBF), with Daly's (2006) correction
  sqrt(2 stall MTBF) - stall when the stall is below twice the MTBF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from sim.errors import ConfigError

CHECKPOINT_KEYS = ("interval_s", "mode", "storage_Bps_per_node")
FAILURE_KEYS = ("mtbf_hours_per_gpu", "mtbf_hours_per_node", "restart_s")
CHECKPOINT_MODES = ("sync", "async")
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSpec:
    interval_s: float
    mode: str  # "sync" | "async"
    storage_Bps_per_node: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSpec:
    mtbf_s_per_gpu: float | None
    mtbf_s_per_node: float | None
    restart_s: float


def _positive(table: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"[{where}] {key} = {value!r} must be a number > 0")
    return float(value)


def _table(table: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """``table`` checked to be a table holding only ``keys``."""
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] must be a table with {', '.join(keys)}")
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise ConfigError(f"[{where}] unknown key '{unknown[0]}'; allowed: {', '.join(keys)}")
    return table


def parse_checkpoint(table: Any) -> CheckpointSpec | None:
    if table is None:
        return None
    where = "training.checkpoint"
    table = _table(table, where, CHECKPOINT_KEYS)
    for key in ("interval_s", "storage_Bps_per_node"):
        if key not in table:
            raise ConfigError(f"[{where}] needs '{key}'")
    mode = table.get("mode", "sync")
    if mode not in CHECKPOINT_MODES:
        raise ConfigError(f"[{where}] mode = {mode!r} must be one of {', '.join(CHECKPOINT_MODES)}")
    return CheckpointSpec(
        interval_s=_positive(table, "interval_s", where), mode=mode,
        storage_Bps_per_node=_positive(table, "storage_Bps_per_node", where),
    )


def parse_failures(table: Any) -> FailureSpec | None:
    if table is None:
        return None
    where = "training.failures"
    table = _table(table, where, FAILURE_KEYS)
    given = [key for key in ("mtbf_hours_per_gpu", "mtbf_hours_per_node") if key in table]
    if len(given) != 1:
        raise ConfigError(f"[{where}] needs exactly one of mtbf_hours_per_gpu, mtbf_hours_per_node (got {given or 'none'})")
    hours = _positive(table, given[0], where)
    return FailureSpec(
        mtbf_s_per_gpu=hours * SECONDS_PER_HOUR if given[0] == "mtbf_hours_per_gpu" else None,
        mtbf_s_per_node=hours * SECONDS_PER_HOUR if given[0] == "mtbf_hours_per_node" else None,
        restart_s=_nonnegative(table, "restart_s", where),
    )


def _nonnegative(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"[{where}] {key} = {value!r} must be a number >= 0")
    return float(value)


def checkpoint_bytes(setup: Any) -> float:
    """Bytes of one checkpoint: 16-bit weights + optimizer state of every parameter, once."""
    from sim.training.memory import ADAM_STATE_BYTES, SGD_STATE_BYTES, WEIGHT_BYTES

    state = ADAM_STATE_BYTES if setup.job.optimizer == "adam" else SGD_STATE_BYTES
    return setup.model.total_parameters() * (WEIGHT_BYTES + state)


def checkpoint_times_s(setup: Any, spec: CheckpointSpec) -> tuple[float, float]:
    """(stall of training per checkpoint, time until the checkpoint is durable after it starts)."""
    cluster = setup.cluster
    node = cluster.node
    total = checkpoint_bytes(setup)
    nodes = max(1, math.ceil(cluster.num_gpus / node.gpus_per_node))
    flush_s = total / nodes / spec.storage_Bps_per_node
    if spec.mode == "sync":
        return flush_s, flush_s
    share = min(node.gpus_per_pcie_switch, node.gpus_per_node)  # GPUs sharing a host link, all copying
    snapshot_s = total / cluster.num_gpus / (node.device_to_host_Bps / share)
    # the flush of one checkpoint must end before the next begins; the excess stalls training
    stall = snapshot_s + max(0.0, snapshot_s + flush_s - spec.interval_s)
    return stall, snapshot_s + flush_s


def job_mtbf_s(setup: Any, spec: FailureSpec) -> float:
    cluster = setup.cluster
    if spec.mtbf_s_per_gpu is not None:
        return spec.mtbf_s_per_gpu / cluster.num_gpus
    nodes = max(1, math.ceil(cluster.num_gpus / cluster.node.gpus_per_node))
    return spec.mtbf_s_per_node / nodes  # type: ignore[operator]


def optimal_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young's sqrt(2 delta M), with Daly's first-order correction - delta when delta < 2 M."""
    young = math.sqrt(2.0 * stall_s * mtbf_s)
    return young - stall_s if stall_s < 2.0 * mtbf_s and young > stall_s else young


def goodput_metrics(setup: Any, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint / failure fields of the training metrics (empty without either table)."""
    checkpoint, failures = setup.checkpoint, setup.failures
    if checkpoint is None and failures is None:
        return {}
    out: dict[str, Any] = {}
    stall = durable = 0.0
    if checkpoint is not None:
        stall, durable = checkpoint_times_s(setup, checkpoint)
        out["checkpoint_bytes"] = checkpoint_bytes(setup)
        out["checkpoint_stall_s"] = stall
        out["checkpoint_stall_s_per_iteration"] = stall * metrics["iteration_time_s"] / checkpoint.interval_s
    waste = stall / checkpoint.interval_s if checkpoint is not None else 0.0
    if failures is not None:
        mtbf = job_mtbf_s(setup, failures)
        out["job_mtbf_s"] = mtbf
        # since the last durable checkpoint: half an interval on average, plus the flush latency
        assert checkpoint is not None  # parse_training requires [training.checkpoint] with failures
        lost = checkpoint.interval_s / 2.0 + (durable - stall if checkpoint.mode == "async" else 0.0) + failures.restart_s
        out["optimal_checkpoint_interval_s"] = optimal_interval_s(stall, mtbf)
        out["expected_lost_work_s"] = lost
        waste += lost / mtbf
    out["goodput_tokens_per_s"] = metrics["tokens_per_s"] * max(0.0, 1.0 - waste)
    return out
