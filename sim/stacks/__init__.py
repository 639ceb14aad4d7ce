"""Software-stack profiles: what a training or serving framework does that the hardware does not
decide (attention kernel, which communications overlap, gradient-reduction dtype, how weight
gradients accumulate, host overheads, decode-attention kernel choice).

One TOML file per stack under ``sim/stacks/training/`` and ``sim/stacks/serving/``; each holds a
``[settings]`` table and a ``[sources]`` table giving the source of every setting. A config names
its stack with ``[training] framework`` / ``[serving] framework``; every setting can still be given
in the config, which then wins over the profile. Without ``framework`` the documented default stack
applies (``DEFAULT_FRAMEWORK``).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Mapping

from sim.errors import ConfigError

STACKS_DIR = Path(__file__).parent
KINDS = ("training", "serving")

# The stack a config gets without `framework`: Megatron-Core with Transformer Engine for training
# (the maintained NVIDIA stack of 2024-25), vLLM for serving.
DEFAULT_FRAMEWORK = {"training": "megatron-core", "serving": "vllm"}

# Every setting a profile of each kind may hold: allowed values (a tuple) or the Python type of a
# number, and the config section where a user overrides it.
SETTINGS: dict[str, dict[str, tuple[str, Any]]] = {
    "training": {
        "attention_kernel": ("training", ("flash", "flash2", "flash1", "cudnn", "unfused")),
        "grad_reduce_dtype": ("training", ("auto", "fp32", "bf16", "16bit")),
        "main_grad_accumulation": ("training", ("fused", "unfused", "none", "flat_param")),
        "optimizer_kernels": ("training", ("fused", "per_op")),
        "grad_buffer_passes": ("training", ("shard", "megatron_ddp")),
        "fsdp_unit": ("training", ("layer", "chunk")),
        "fsdp_kept_after_forward": ("training", ("none", "root", "root_last_layer")),
        "tp_gathered_input": ("training", ("regather", "save")),
        "moe_expert_gemm": ("training", ("grouped", "per_expert")),
        "moe_prob_scaling": ("training", ("hidden", "activation")),
        "moe_dispatcher": ("training", ("alltoall", "flex")),
        "param_gather_pacing": ("training", ("bucket", "free")),
        "linear_bias": ("training", ("fused", "unfused", "skip_bias_add")),
        "fp8_recipe": ("training", ("delayed", "current")),
        "fp8_backward_accumulation": ("training", ("split", "fast")),
        "fp8_params": ("training", bool),
        "fp8_all_gather": ("training", bool),
        "fp8_bf16_edge_layers": ("training", float),
        "fp8_cast_fusion": ("training", ("norm_activation", "norm", "none", "compiled")),
        "fp8_scale_update": ("training", ("per_module", "fused")),
        "cross_entropy": ("training", ("unfused", "native", "te", "torch", "torch_16bit", "xentropy")),
        "qkv_split": ("training", ("none", "concat", "concat_copy_v")),
        "attention_layout": ("training", ("native", "flash_bshd", "torch_sdpa")),
        "elementwise": ("training", ("fused", "eager", "eager_fused_norm")),
        "host_forward_op_us": ("training", float),
        "host_backward_op_us": ("training", float),
        "selective_recompute": ("training", ("attention_core", "per_op")),
        "dp_comm_overlap": ("parallel", bool),
        "tp_comm_overlap": ("parallel", bool),
        "tp_overlap_method": ("parallel", ("userbuffers", "symmetric_memory")),
        "pipeline_p2p": ("parallel", ("overlapped", "blocking")),
    },
    "serving": {
        "step_overhead_us": ("serving", float),
        "request_overhead_us": ("serving", float),
        "decode_attention": ("serving", ("shared_kv", "per_query_head", "xqa")),
        "kv_cache_memory": ("serving", ("total_fraction", "free_fraction")),
        "tp_all_reduce": ("serving", ("nccl", "trtllm", "vllm", "sglang")),
        "custom_all_reduce_max_bytes": ("serving", float),
        "cuda_graph_padding": ("serving", ("none", "vllm-v0")),
        "api_server_token_overhead_us": ("serving", float),
        "chunked_prefill": ("serving", bool),
        "block_size": ("serving", int),
        "tp_logits": ("serving", ("shard", "all_gather")),
        "custom_all_reduce_launch": ("serving", ("collective", "kernel")),
        "runtime_reserve_MiB": ("serving", float),
        "decoder_buffers": ("serving", ("logits", "trtllm")),
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class StackProfile:
    """One software stack: its settings and the source of each."""

    name: str
    kind: str
    summary: str
    settings: Mapping[str, Any]
    sources: Mapping[str, str]


def _check_value(kind: str, key: str, value: Any, where: str) -> Any:
    if key not in SETTINGS[kind]:
        raise ConfigError(f"{where}: unknown setting '{key}'; allowed: {', '.join(SETTINGS[kind])}")
    allowed = SETTINGS[kind][key][1]
    if isinstance(allowed, tuple):
        if value not in allowed:
            raise ConfigError(f"{where} {key} = {value!r}; allowed: {', '.join(allowed)}")
        return value
    if allowed is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where} {key} = {value!r} must be an integer >= 1")
        return value
    if allowed is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} {key} = {value!r} must be true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where} {key} = {value!r} must be a number >= 0")
    if not math.isfinite(value):
        raise ConfigError(f"{where} {key} = {value!r} must be a finite number >= 0")
    return float(value)


def _load(kind: str, path: Path) -> StackProfile:
    where = f"sim/stacks/{kind}/{path.name}"
    with path.open("rb") as f:
        data = tomllib.load(f)
    unknown = sorted(set(data) - {"name", "summary", "settings", "sources"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}")
    settings = {key: _check_value(kind, key, value, where) for key, value in data.get("settings", {}).items()}
    missing = sorted(set(SETTINGS[kind]) - set(settings))
    if missing:
        raise ConfigError(f"{where}: settings {missing} missing (every profile sets every setting)")
    sources = dict(data.get("sources", {}))
    unsourced = sorted(set(settings) - set(sources))
    if unsourced:
        raise ConfigError(f"{where}: settings {unsourced} have no [sources] entry")
    return StackProfile(name=str(data["name"]), kind=kind, summary=str(data.get("summary", "")), settings=settings,
                        sources=sources)


@cache
def profiles(kind: str) -> dict[str, StackProfile]:
    """Every shipped profile of ``kind`` ("training" | "serving"), by name."""
    out = {}
    for path in sorted((STACKS_DIR / kind).glob("*.toml")):
        profile = _load(kind, path)
        out[profile.name] = profile
    return out


def get_stack(kind: str, name: str | None) -> StackProfile:
    """The profile ``name`` of ``kind`` (the default stack when ``name`` is None)."""
    name = DEFAULT_FRAMEWORK[kind] if name is None else name
    catalog = profiles(kind)
    if name not in catalog:
        raise ConfigError(f"[{kind}] framework = {name!r}; allowed: {', '.join(catalog)}")
    return catalog[name]


def resolve_settings(kind: str, config: Mapping[str, Any]) -> tuple[StackProfile, dict[str, Any]]:
    """The stack ``[kind] framework`` names and its settings with the config's own values applied
    (a setting given in its config section wins over the profile)."""
    table = config.get(kind, {}) if isinstance(config.get(kind, {}), Mapping) else {}
    name = table.get("framework")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"[{kind}] framework = {name!r} must be a string; allowed: {', '.join(profiles(kind))}")
    profile = get_stack(kind, name)
    settings = dict(profile.settings)
    for key, (where, _) in SETTINGS[kind].items():
        section = config.get(where, {})
        if isinstance(section, Mapping) and key in section:
            settings[key] = _check_value(kind, key, section[key], f"[{where}]")
    return profile, settings
