"""What ``llmsim simulate`` checks around a run: which sections apply to the config's kind, output
paths (checked before simulating), the resolved config for ``run.json``, strict JSON, and ``-v``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from sim import notices
from sim.config_keys import PUBLISHED_KEYS, PUBLISHED_METRICS, SERVING_SECTIONS, TRAINING_SECTIONS
from sim.errors import ConfigError
from sim.jsonout import dumps
from sim.stacks import SETTINGS, resolve_settings


def config_kind(config: Mapping[str, Any]) -> str:
    """"training" or "serving" (exactly one of the two sections; ``simulate`` repeats the check)."""
    has_training, has_serving = "training" in config, "serving" in config
    if has_training == has_serving:
        raise ConfigError("a config for `simulate` must hold exactly one of [training] or [serving]")
    return "training" if has_training else "serving"


def check_sections(file_config: Mapping[str, Any], overrides: Sequence[str], command: str = "simulate") -> str:
    """Reject sections (in the file or in ``--set``) that the config's kind never reads; ``[search]``
    is read only by ``llmsim search`` and draws a warning elsewhere. Returns the kind."""
    kind = config_kind(file_config) if command == "simulate" else "search"
    allowed = {"training": TRAINING_SECTIONS, "serving": SERVING_SECTIONS}.get(kind)
    if allowed is None:
        return kind
    for assignment in overrides:
        name = assignment.partition("=")[0].strip().split(".")[0]
        if name == "search":
            raise ConfigError(f"--set '{assignment}': [search] is read only by `llmsim search`, not by `simulate`")
        if name not in allowed and name in ("training", "parallel", "serving", "workload", "slo"):
            raise ConfigError(
                f"--set '{assignment}': a {kind} config has no [{name}] (it reads [{'], ['.join(allowed)}])"
            )
    for name in file_config:
        if name == "search":
            notices.warn("[search] is read only by `llmsim search`; `simulate` ignores it")
        elif name not in allowed:
            raise ConfigError(
                f"[{name}] does not apply to a {kind} config (it reads [{'], ['.join(allowed)}]); remove it"
            )
    return kind


# ---- output paths ---------------------------------------------------------------------------------


def _check_writable_dir(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what} '{folder}' exists and is not a folder") from None
    except OSError as exc:
        raise ConfigError(f"{what} '{folder}' cannot be created: {exc.strerror}") from None
    if not folder.is_dir():
        raise ConfigError(f"{what} '{folder}' exists and is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} '{folder}' is not writable")


def prepare_outputs(out: str | None, trace: str | None) -> tuple[Path | None, Path | None]:
    """Check (and create) ``--out DIR`` and the ``--trace`` file's folder before anything runs.
    ``trace`` is "" for a bare ``--trace``: DIR/trace.json with --out, else ./trace.json."""
    out_dir = Path(out) if out else None
    if out_dir is not None:
        _check_writable_dir(out_dir, "--out")
    trace_path: Path | None = None
    if trace is not None:
        trace_path = Path(trace) if trace else (out_dir or Path(".")) / "trace.json"
        if trace_path.is_dir():
            raise ConfigError(f"--trace '{trace_path}' is a folder; give a file name such as '{trace_path / 'trace.json'}'")
        if out_dir is not None and trace_path.resolve() == (out_dir / "run.json").resolve():
            raise ConfigError(f"--trace '{trace_path}' would overwrite the run.json that --out writes; choose another name")
        _check_writable_dir(trace_path.parent, "--trace folder")
    return out_dir, trace_path


# ---- resolved config ----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def resolved_config(config: Mapping[str, Any], result: Any, seed: int | None, config_dir: Path | None = None) -> dict[str, Any]:
    """The config as run: every default filled in, ``dp = "auto"`` and the serving replicas resolved,
    and the files it names (a ``file:`` schedule, a request trace) resolved against ``config_dir``, the
    config file's folder, so that it reruns from anywhere."""
    resolved = json.loads(dumps(config, default=str))
    if config_dir is not None:
        parallel, workload = resolved.get("parallel"), resolved.get("workload")
        schedule = parallel.get("schedule") if isinstance(parallel, dict) else None
        if isinstance(schedule, str) and schedule.startswith("file:"):
            parallel["schedule"] = "file:" + str(config_dir / schedule.removeprefix("file:"))
        if isinstance(workload, dict) and isinstance(workload.get("trace"), str):
            workload["trace"] = str(config_dir / workload["trace"])
    setup = getattr(result, "setup", None)
    if setup is not None:
        cluster = resolved.setdefault("cluster", {})
        if setup.groups:  # a heterogeneous cluster: each group its GPU and node
            cluster.update(num_gpus=setup.cluster.num_gpus, network=setup.cluster.network.name, groups=[
                {"gpu": g.cluster.gpu.name, "num_gpus": g.cluster.num_gpus, "node": g.cluster.node.name, **(
                    {"calibration": c["calibration"]} if "calibration" in c else {})}
                for g, c in zip(setup.groups, cluster.get("groups", [{}] * len(setup.groups)))
            ])
        else:
            cluster.update(gpu=setup.cluster.gpu.name, num_gpus=setup.cluster.num_gpus,
                           node=setup.cluster.node.name, network=setup.cluster.network.name)
        training = resolved.setdefault("training", {})
        for f in ("seq_len", "global_batch", "micro_batch", "precision", "optimizer"):
            training[f] = getattr(setup.job, f)
        training["attention_kernel"] = setup.attention_kernel
        parallel = resolved.setdefault("parallel", {})
        for f in dataclasses.fields(setup.plan):
            parallel[f.name] = _plain(getattr(setup.plan, f.name))
        # the plan's fields in their config forms: no recomputed layers 0; hsdp false, true (shard inside a
        # node) or the shard group's size
        parallel["recompute_layers"] = parallel["recompute_layers"] or 0
        shard = parallel.pop("hsdp_shard")
        parallel["hsdp"] = (shard or True) if setup.plan.hsdp else False
        parallel.update(dp_comm_overlap=setup.dp_comm_overlap, expert_load_imbalance=setup.expert_load_imbalance)
        # overlap_slowdown only as given: set, it also fixes the data-parallel stream's slowdown, which is
        # otherwise each group's own (its NCCL channels), so the default would not rerun the same
        if "overlap_slowdown" in config.get("parallel", {}):
            parallel["overlap_slowdown"] = setup.overlap_slowdown
        # the software stack's settings as the run took them (its profile, under the config's own values)
        training.setdefault("framework", setup.framework)
        training.setdefault("elementwise", setup.elementwise)  # (compile = true makes it "fused")
        training.setdefault("fp8_cast_fusion", setup.fp8_cast_fusion)  # (compile = true makes "none" "compiled")
        training.setdefault("fp8_params", setup.job.fp8_params)  # (fp8 runs only)
        _, settings = resolve_settings("training", config)
        for key, (section, _) in SETTINGS["training"].items():
            (training if section == "training" else parallel).setdefault(key, settings[key])
        if setup.groups:
            parallel["stage_groups"] = list(setup.stage_group)
        return resolved
    system = getattr(result, "system", None)
    if system is None:
        return resolved
    spec = system.spec
    cluster = resolved.setdefault("cluster", {})
    cluster.update(gpu=system.cluster.gpu.name, num_gpus=system.cluster.num_gpus,
                   node=system.cluster.node.name, network=system.cluster.network.name)
    serving = resolved.setdefault("serving", {})
    renamed = {"swap_space_bytes": ("swap_space_GiB", 2**30), "step_overhead_s": ("step_overhead_us", 1e-6),
               "request_overhead_s": ("request_overhead_us", 1e-6), "runtime_reserve_bytes": ("runtime_reserve_MiB", 2**20),
               "api_server_token_overhead_s": ("api_server_token_overhead_us", 1e-6)}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name in renamed:
            name, unit = renamed[f.name]
            serving[name] = value / unit
        elif f.name in ("disaggregated", "speculative"):
            if value is not None:
                serving[f.name] = {g.name: getattr(value, g.name) for g in dataclasses.fields(value)}
        elif f.name == "compute_precision":
            continue
        elif value is not None:
            serving[f.name] = value
    if seed is not None:
        resolved.setdefault("workload", {})["seed"] = seed
    return resolved


# ---- -v --------------------------------------------------------------------------------------------------


def verbose_report(result: Any, resolved: Mapping[str, Any]) -> None:
    """``-v``: the resolved config and where the time goes (training: the costliest ops of a layer;
    serving: each pool's memory plan), on stderr so stdout stays the table or the JSON."""
    lines = ["resolved config:"]
    for name, table in resolved.items():
        if isinstance(table, Mapping):
            items = "  ".join(f"{k}={v!r}" for k, v in table.items() if not isinstance(v, Mapping))
            lines.append(f"  [{name}] {items}")
            for sub, subtable in table.items():
                if isinstance(subtable, Mapping):
                    lines.append(f"  [{name}.{sub}] " + "  ".join(f"{k}={v!r}" for k, v in subtable.items()))
    sources = result.metrics().get("cost_sources")
    if isinstance(sources, Mapping) and sources:
        lines.append("cost sources (share of predicted op time): "
                     + "  ".join(f"{k} {v:.1%}" for k, v in sources.items() if isinstance(v, int | float)))
    if hasattr(result, "op_frame"):
        frame = result.op_frame()
        total = frame["seconds"].sum()
        top = frame.sort_values("seconds", ascending=False).head(12)
        lines.append(f"costliest ops of one layer (F/B/W, per micro-batch; {len(frame)} ops, {total * 1e3:.3f} ms in all):")
        for row in top.itertuples():
            share = row.seconds / total if total > 0 else 0.0
            lines.append(f"  {row.layer_kind:<5} {row._2} {row.op:<28} {row.kind:<10} {row.seconds * 1e3:10.4f} ms  {share:6.1%}")
    sources = result.metrics().get("cost_sources") if hasattr(result, "metrics") else None
    if sources:
        gpu = result.setup.cluster.gpu if hasattr(result, "setup") else result.system.cluster.gpu
        profile = gpu.calibration.describe()["file"] if gpu.calibration is not None else "none (analytic defaults)"
        lines.append("op costs from: " + ", ".join(f"{k} {v:.1%}" for k, v in sources.items()) + f" (calibration profile: {profile})")
    system = getattr(result, "system", None)
    if system is not None:
        gib = 2**30
        for pool in system.pools:
            m = pool.memory
            lines.append(
                f"{pool.role} memory per GPU: budget {m.budget_bytes / gib:.2f} GiB = weights {m.weights_bytes / gib:.2f}"
                f" + workspace {m.workspace_bytes / gib:.2f} + NCCL {m.comm_bytes / gib:.2f} + runtime {m.runtime_bytes / gib:.2f}"
                f" + KV {max(m.kv_bytes, 0) / gib:.2f} GiB"
                f" ({m.num_blocks:,} blocks of {m.block_size} tokens, {m.kv_bytes_per_token:,.0f} B per token per GPU)"
            )
    print("\n".join(lines), file=sys.stderr)


def reference_lines(result: Any) -> dict[str, tuple[float, str]]:
    """Horizontal lines for sweep plots: the GPU's HBM on memory plots, SLO limits on latency plots."""
    lines: dict[str, tuple[float, str]] = {}
    setup = getattr(result, "setup", None)
    if setup is not None:
        lines["peak_memory_bytes"] = (setup.cluster.gpu.hbm_capacity_bytes, f"{setup.cluster.gpu.name} HBM capacity")
    slo = getattr(result, "slo", None)
    if slo is not None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            limit = getattr(slo, name, None)
            if limit is not None:
                for stat in ("p50", "p90", "p99"):
                    lines[f"{name}.{stat}"] = (limit, f"SLO {name.removesuffix('_s').upper()} {limit:g} s")
    return lines


def published_comparison(config: Mapping[str, Any], result: Any) -> dict[str, Any] | None:
    """``[published]`` beside the prediction: {source, metrics: {key: {published, predicted, error}}}
    with error = predicted / published - 1; None without the section."""
    table = config.get("published")
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError(f"[published] must be a table, got {table!r}")
    for key, value in table.items():
        if key not in PUBLISHED_KEYS:
            raise ConfigError(f"[published] unknown key '{key}'; allowed: {', '.join(PUBLISHED_KEYS)}")
        if key == "source":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"[published] source = {value!r} must be a citation string")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"[published] {key} = {value!r} must be a finite number > 0")
    if "source" not in table:
        raise ConfigError("[published] needs 'source' (where the number was published)")
    metrics = dict(result.metrics())
    if "hfu" in metrics and "mfu" in metrics and metrics["mfu"]:
        metrics["hardware_flops_per_s_per_gpu"] = metrics["model_flops_per_s_per_gpu"] * metrics["hfu"] / metrics["mfu"]
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key == "source":
            continue
        label, metric, scale = PUBLISHED_METRICS[key]
        predicted = metrics.get(metric)
        if not isinstance(predicted, int | float):
            raise ConfigError(f"[published] {key}: this run has no {metric} to compare with")
        predicted *= scale
        out[key] = {"label": label, "published": float(value), "predicted": predicted, "error": predicted / value - 1}
    return {"source": table["source"], "metrics": out}


def comparison_lines(comparison: Mapping[str, Any]) -> list[str]:
    lines = [f"published ({comparison['source']}):"]
    for row in comparison["metrics"].values():
        lines.append(f"  {row['label']:<36} published {row['published']:,.4g}  predicted {row['predicted']:,.4g}  "
                     f"error {row['error']:+.1%}")
    return lines
