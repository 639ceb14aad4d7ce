"""``[serving]`` (with ``[serving.disaggregated]`` and ``[serving.speculative]``): validated, frozen.

Defaults follow vLLM's engine arguments (max_num_seqs 256, block_size 16, gpu_memory_utilization
0.9, swap_space 4 GiB per GPU) unless noted. CPU overheads and the decode-attention kernel come from
the software-stack profile ``framework`` (sim/stacks/serving/; default "vllm": the BLIS
"trained-physics" coefficients fitted on H100 vLLM traces, 126 us per step and 4 us per request in
the batch, ../shared/reference/formulas.md, Serving / Step time); the config's keys override them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from hardware.units import GiB, MiB, us
from sim.errors import ConfigError
from sim.notices import warn
from sim.stacks import get_stack, resolve_settings
from sim.serving.schedulers import PREEMPTION_MODES
from workloads.model import ModelSpec

SCHEDULERS = ("static", "orca", "inflight", "vllm", "sarathi", "disaggregated")
ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")
WEIGHT_PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
KV_PRECISIONS = ("bf16", "fp16", "fp8", "int4")
SPECULATIVE_METHODS = ("draft", "draft_free")

SERVING_KEYS = (
    "tp", "pp", "ep", "scheduler", "weight_precision", "kv_precision", "max_num_seqs", "max_batched_tokens",
    "chunk_size", "block_size", "gpu_memory_utilization", "prefix_caching", "replicas", "router",
    "chunked_prefill", "preemption_mode", "swap_space_GiB", "step_overhead_us", "request_overhead_us",
    "max_model_len", "disaggregated", "speculative", "framework", "decode_attention", "kv_cache_memory",
    "tp_all_reduce", "custom_all_reduce_max_bytes", "cuda_graph_padding", "tp_logits", "api_server_token_overhead_us",
    "api_server", "custom_all_reduce_launch", "runtime_reserve_MiB", "decoder_buffers",
)
DISAGGREGATED_KEYS = ("prefill_replicas", "decode_replicas", "prefill_tp", "decode_tp")
SPECULATIVE_KEYS = ("method", "draft_model", "num_speculative_tokens", "acceptance_rate", "draft_free_overhead")

# vLLM defaults (vllm/engine/arg_utils.py): max_num_seqs 256, block_size 16, gpu_memory_utilization
# 0.9, swap_space 4 GiB; max_num_batched_tokens 8192 for chunked prefill (V1 default for online serving).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192
DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_SWAP_SPACE_GIB = 4.0
# Sarathi-Serve's token budget for Mistral-7B / A100 (paper: 512 for the strict SLO setting).
DEFAULT_CHUNK_SIZE = 512
# The default stack's CPU overheads (sim/stacks/serving/vllm.toml: BLIS beta7 per step, beta6 per request).
_DEFAULT_STACK = get_stack("serving", None).settings
DEFAULT_STEP_OVERHEAD_US = float(_DEFAULT_STACK["step_overhead_us"])
DEFAULT_REQUEST_OVERHEAD_US = float(_DEFAULT_STACK["request_overhead_us"])


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeSpec:
    method: str  # "draft" (a draft model from the catalog) | "draft_free" (Medusa / lookahead heads)
    num_speculative_tokens: int  # k
    acceptance_rate: float  # alpha: each draft token is accepted with this probability (given its predecessors)
    draft_model: str | None = None
    draft_free_overhead: float = 0.0  # draft_free: extra fraction of the verification step's time

    def expected_tokens_per_step(self) -> float:
        """(1 - alpha^(k+1)) / (1 - alpha): accepted drafts plus the one token the verifier adds."""
        a, k = self.acceptance_rate, self.num_speculative_tokens
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggregatedSpec:
    prefill_replicas: int
    decode_replicas: int
    prefill_tp: int
    decode_tp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSpec:
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert-parallel groups of tp GPUs per pipeline stage (MoE; see ReplicaShape)
    scheduler: str = "vllm"
    weight_precision: str = "bf16"
    kv_precision: str = "bf16"
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    chunk_size: int = DEFAULT_CHUNK_SIZE
    block_size: int = DEFAULT_BLOCK_SIZE
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    prefix_caching: bool = False
    replicas: int = 1
    router: str = "least_outstanding"
    chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    swap_space_bytes: float = DEFAULT_SWAP_SPACE_GIB * GiB
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_US * us
    request_overhead_s: float = DEFAULT_REQUEST_OVERHEAD_US * us
    max_model_len: int | None = None  # None: the model's max_seq_len
    framework: str = "vllm"  # the software-stack profile (sim/stacks/serving/)
    decode_attention: str = "shared_kv"  # the stack's decode-attention kernel rule (see sim.serving.stepcost)
    # what gpu_memory_utilization is a fraction of: "total_fraction" (vLLM: the whole GPU; KV gets the
    # rest after weights) | "free_fraction" (TensorRT-LLM: the memory left free after weights)
    kv_cache_memory: str = "total_fraction"
    # device memory the serving process holds outside its own allocations (CUDA context, library
    # handles and workspaces) that its KV budget loses, bytes (sim.serving.capacity.replica_memory)
    runtime_reserve_bytes: float = 0.0
    # what the stack keeps per sequence slot for sampling: "logits" | "trtllm" (sim.serving.capacity)
    decoder_buffers: str = "logits"
    # the kernel of tensor-parallel all-reduces: "nccl", or a serving framework's own all-reduce
    # ("trtllm", "vllm", "sglang"), priced from the calibration profile's measured curve of it
    tp_all_reduce: str = "nccl"
    # the LM head's vocab-parallel logits under tp > 1: "shard" (each rank samples its own vocab
    # shard, no exchange) | "all_gather" (TensorRT-LLM: gathered onto every rank, each rank's decoder
    # samples the full vocabulary; see sim.serving.stepcost)
    tp_logits: str = "shard"
    # per-call host cost of the stack's own all-reduce kernel: "collective" (as a framework's NCCL call,
    # hardware.collectives.COLLECTIVE_LAUNCH_OVERHEAD_S) | "kernel" (one kernel launch inside the engine)
    custom_all_reduce_launch: str = "collective"
    # largest all-reduce (bytes) the stack's own kernel takes, NCCL above; 0: the faster of both per size
    custom_all_reduce_max_bytes: float = 0.0
    # decode-only steps replayed as CUDA graphs captured at fixed batch sizes: "none" | "vllm-v0"
    # (sim.serving.stepcost.cuda_graph_batch)
    cuda_graph_padding: str = "none"
    # requests arrive through the stack's HTTP API server with token streaming (vLLM benchmark_serving.py
    # against the OpenAI server), not through the offline engine API (LLM.generate, benchmark_throughput.py)
    api_server: bool = False
    # host time per streamed token the stack's API server spends in the engine's process (0: none there)
    api_server_token_overhead_s: float = 0.0
    disaggregated: DisaggregatedSpec | None = None
    speculative: SpeculativeSpec | None = None
    compute_precision: str | None = None  # 16-bit activation format when the GPU forces one (no bf16)

    @property
    def activation_precision(self) -> str:
        """Activations (and the attention kernel's Q/O) run in fp16 when the weights are fp16, else bf16
        (fp16 on a GPU without bf16: see ``fit_precisions``)."""
        if self.compute_precision is not None:
            return self.compute_precision
        return "fp16" if self.weight_precision == "fp16" else "bf16"


def _int(table: Mapping[str, Any], key: str, where: str, default: int, minimum: int = 1) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{key} = {value!r} must be an integer >= {minimum}")
    return value


def _float(table: Mapping[str, Any], key: str, where: str, default: float, low: float, high: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{where}.{key} = {value!r} must be a number in [{low}, {high}]")
    return float(value)


def _choice(table: Mapping[str, Any], key: str, where: str, default: str, allowed: tuple[str, ...]) -> str:
    value = table.get(key, default)
    if value not in allowed:
        raise ConfigError(f"{where}.{key} = {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _bool(table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} = {value!r} must be true or false")
    return value


def _check_keys(table: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"[{where}] unknown key '{key}'; allowed: {', '.join(allowed)}")


def parse_serving(table: Mapping[str, Any]) -> ServingSpec:
    """Validate ``[serving]``; errors name the field, the value and what is allowed."""
    w = "serving"
    _check_keys(table, w, SERVING_KEYS)
    for key, allowed in (("weight_precision", WEIGHT_PRECISIONS), ("kv_precision", KV_PRECISIONS)):
        if key in table and (not isinstance(table[key], str) or table[key] not in allowed):
            raise ConfigError(f"serving.{key} = {table[key]!r}; allowed: {', '.join(allowed)}")
    stack, settings = resolve_settings("serving", {"serving": table})
    spec: dict[str, Any] = dict(
        framework=stack.name,
        decode_attention=settings["decode_attention"],
        kv_cache_memory=settings["kv_cache_memory"],
        runtime_reserve_bytes=settings["runtime_reserve_MiB"] * MiB,
        decoder_buffers=settings["decoder_buffers"],
        tp_all_reduce=settings["tp_all_reduce"],
        tp_logits=settings["tp_logits"],
        custom_all_reduce_launch=settings["custom_all_reduce_launch"],
        custom_all_reduce_max_bytes=settings["custom_all_reduce_max_bytes"],
        cuda_graph_padding=settings["cuda_graph_padding"],
        api_server_token_overhead_s=settings["api_server_token_overhead_us"] * us,
        api_server=_bool(table, "api_server", w, False),
        tp=_int(table, "tp", w, 1),
        pp=_int(table, "pp", w, 1),
        ep=_int(table, "ep", w, 1),
        scheduler=_choice(table, "scheduler", w, "vllm", SCHEDULERS),
        weight_precision=_choice(table, "weight_precision", w, "bf16", WEIGHT_PRECISIONS),
        kv_precision=_choice(table, "kv_precision", w, "bf16", KV_PRECISIONS),
        max_num_seqs=_int(table, "max_num_seqs", w, DEFAULT_MAX_NUM_SEQS),
        max_batched_tokens=_int(table, "max_batched_tokens", w, DEFAULT_MAX_BATCHED_TOKENS),
        chunk_size=_int(table, "chunk_size", w, DEFAULT_CHUNK_SIZE),
        block_size=settings["block_size"],
        gpu_memory_utilization=_float(table, "gpu_memory_utilization", w, DEFAULT_GPU_MEMORY_UTILIZATION, 0.01, 1.0),
        prefix_caching=_bool(table, "prefix_caching", w, False),
        replicas=_int(table, "replicas", w, 1),
        router=_choice(table, "router", w, "least_outstanding", ROUTERS),
        chunked_prefill=settings["chunked_prefill"],
        preemption_mode=_choice(table, "preemption_mode", w, "recompute", PREEMPTION_MODES),
        swap_space_bytes=_float(table, "swap_space_GiB", w, DEFAULT_SWAP_SPACE_GIB, 0.0, 1e6) * GiB,
        step_overhead_s=settings["step_overhead_us"] * us,
        request_overhead_s=settings["request_overhead_us"] * us,
    )
    if "max_model_len" in table:
        spec["max_model_len"] = _int(table, "max_model_len", w, 1)
    if "disaggregated" in table:
        if spec["scheduler"] != "disaggregated":  # e.g. the disaggregated example run colocated with --set
            warn(f"[serving.disaggregated] is ignored: serving.scheduler = {spec['scheduler']!r} (the table applies "
                 "to scheduler = 'disaggregated' only)")
        spec["disaggregated"] = _parse_disaggregated(table["disaggregated"], spec["tp"])
    elif spec["scheduler"] == "disaggregated":
        spec["disaggregated"] = DisaggregatedSpec(
            prefill_replicas=1, decode_replicas=1, prefill_tp=spec["tp"], decode_tp=spec["tp"]
        )
    if "speculative" in table:
        spec["speculative"] = _parse_speculative(table["speculative"])
    if spec["ep"] > 1 and spec["scheduler"] == "disaggregated":
        raise ConfigError(f"serving.ep = {spec['ep']} with scheduler 'disaggregated': allowed only ep = 1 there "
                          "(the prefill and decode pools set their own tp)")
    return ServingSpec(**spec)


def _check_tensor_parallel(tp: int, model: ModelSpec, where: str) -> None:
    """vLLM's rule: tp divides the attention heads; KV heads are split when tp divides them and
    replicated when they divide tp (GQA/MQA with more ranks than KV heads)."""
    if model.heads % tp:
        allowed = ", ".join(str(d) for d in range(1, model.heads + 1) if model.heads % d == 0)
        raise ConfigError(f"{where} = {tp} must divide the {model.heads} attention heads of {model.name}; allowed: {allowed}")
    if not model.is_mla and model.kv_heads % tp and tp % model.kv_heads:
        raise ConfigError(
            f"{where} = {tp} and the {model.kv_heads} KV heads of {model.name}: one must divide the other "
            "(KV heads are split over tp ranks or replicated across them)"
        )


def check_model_parallelism(spec: ServingSpec, model: ModelSpec) -> None:
    """What needs the model: tensor-parallel degrees that split its heads, and ep > 1 only for an MoE
    model whose routed experts ep divides."""
    if spec.scheduler == "disaggregated" and spec.disaggregated is not None:
        _check_tensor_parallel(spec.disaggregated.prefill_tp, model, "serving.disaggregated.prefill_tp")
        _check_tensor_parallel(spec.disaggregated.decode_tp, model, "serving.disaggregated.decode_tp")
    else:
        _check_tensor_parallel(spec.tp, model, "serving.tp")
    if spec.ep > 1:
        experts = model.experts if model.is_moe else 0
        if experts == 0:
            raise ConfigError(f"serving.ep = {spec.ep} needs an MoE model; {model.name} is dense (allowed: ep = 1)")
        if experts % spec.ep:
            allowed = ", ".join(str(d) for d in range(1, experts + 1) if experts % d == 0)
            raise ConfigError(f"serving.ep = {spec.ep} must divide the {experts} routed experts of {model.name}; "
                              f"allowed: {allowed}")


def gpus_per_replica(spec: ServingSpec) -> int:
    """GPUs one (non-disaggregated) replica spans: tp x ep x pp."""
    return spec.tp * spec.ep * spec.pp


def _parse_disaggregated(table: Any, tp: int) -> DisaggregatedSpec:
    w = "serving.disaggregated"
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{w}] must be a table, got {table!r}")
    _check_keys(table, w, DISAGGREGATED_KEYS)
    return DisaggregatedSpec(
        prefill_replicas=_int(table, "prefill_replicas", w, 1),
        decode_replicas=_int(table, "decode_replicas", w, 1),
        prefill_tp=_int(table, "prefill_tp", w, tp),
        decode_tp=_int(table, "decode_tp", w, tp),
    )


def _parse_speculative(table: Any) -> SpeculativeSpec:
    w = "serving.speculative"
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{w}] must be a table, got {table!r}")
    _check_keys(table, w, SPECULATIVE_KEYS)
    method = _choice(table, "method", w, "draft" if "draft_model" in table else "draft_free", SPECULATIVE_METHODS)
    if method == "draft" and not isinstance(table.get("draft_model"), str):
        raise ConfigError(f"{w}.draft_model = {table.get('draft_model')!r}: method 'draft' needs a catalog model name")
    if "acceptance_rate" not in table or "num_speculative_tokens" not in table:
        raise ConfigError(f"[{w}] needs num_speculative_tokens and acceptance_rate")
    return SpeculativeSpec(
        method=method,
        num_speculative_tokens=_int(table, "num_speculative_tokens", w, 1),
        acceptance_rate=_float(table, "acceptance_rate", w, 0.0, 0.0, 1.0),
        draft_model=table.get("draft_model") if method == "draft" else None,
        draft_free_overhead=_float(table, "draft_free_overhead", w, 0.0, 0.0, 10.0),
    )


def serving_gpus(spec: ServingSpec) -> int:
    """GPUs the serving layout occupies (every pool, every replica)."""
    if spec.scheduler == "disaggregated" and spec.disaggregated is not None:
        d = spec.disaggregated
        return (d.prefill_replicas * d.prefill_tp + d.decode_replicas * d.decode_tp) * spec.pp
    return spec.replicas * gpus_per_replica(spec)


def resolve_replicas(spec: ServingSpec, table: Mapping[str, Any], num_gpus: Any) -> tuple[ServingSpec, bool]:
    """The one rule tying ``[cluster] num_gpus`` to the replicas (docs/configuration.md, [serving]):
    without ``replicas``, num_gpus / (tp x ep x pp) replicas run; a num_gpus the layout cannot use
    exactly is an error. Returns the spec with ``replicas`` resolved and whether it was derived."""
    if num_gpus is None:
        return spec, False
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus <= 0:
        raise ConfigError(f"[cluster] num_gpus = {num_gpus!r} must be a positive integer")
    per_replica = gpus_per_replica(spec)
    derived = False
    if spec.scheduler != "disaggregated" and "replicas" not in table:
        if num_gpus % per_replica:
            raise ConfigError(
                f"[cluster] num_gpus = {num_gpus} is not a multiple of the {per_replica} GPUs of one replica "
                f"(tp {spec.tp} x ep {spec.ep} x pp {spec.pp}); use a multiple of {per_replica} or set serving.replicas"
            )
        spec = replace(spec, replicas=num_gpus // per_replica)
        derived = True
    needed = serving_gpus(spec)
    if num_gpus > needed:
        layout = (
            f"{spec.disaggregated.prefill_replicas} prefill x tp {spec.disaggregated.prefill_tp} + "  # type: ignore[union-attr]
            f"{spec.disaggregated.decode_replicas} decode x tp {spec.disaggregated.decode_tp}, pp {spec.pp}"  # type: ignore[union-attr]
            if spec.scheduler == "disaggregated"
            else f"{spec.replicas} replicas x tp {spec.tp} x ep {spec.ep} x pp {spec.pp}"
        )
        raise ConfigError(
            f"[cluster] num_gpus = {num_gpus} but the serving layout ({layout}) uses {needed}: "
            f"set num_gpus = {needed}, or add replicas to use the other {num_gpus - needed}"
        )
    return spec, derived


# vLLM SchedulerConfig without chunked prefill (V0 0.5.x vllm/config.py; V1 keeps the rule): a step must
# hold a whole prompt, so the default token budget is max(max_model_len, 2048), not the chunked default
UNCHUNKED_MIN_TOKEN_BUDGET = 2048


def resolve_token_budget(spec: ServingSpec, table: Mapping[str, Any], model_max_len: int) -> ServingSpec:
    """The vllm scheduler's token budget when ``max_batched_tokens`` is not given and chunked prefill
    is off: vLLM's default for that mode, max(max_model_len, 2048) (``model_max_len`` is the model's
    context when ``max_model_len`` is not given); otherwise the spec as it is."""
    if "max_batched_tokens" in table or spec.chunked_prefill or spec.scheduler != "vllm":
        return spec
    return replace(spec, max_batched_tokens=max(spec.max_model_len or model_max_len, UNCHUNKED_MIN_TOKEN_BUDGET))


def fit_precisions(spec: ServingSpec, table: Mapping[str, Any], gpu: Any) -> ServingSpec:
    """Weight, KV and activation formats the GPU can run: a default it lacks (bf16 on V100 / T4)
    becomes fp16 with a warning (the KV cache's silently); a weight or KV precision the user gave and the
    GPU lacks is an error."""
    from sim.config import supported_precision

    changes: dict[str, Any] = {}
    if spec.weight_precision in ("bf16", "fp16", "fp8"):
        weight = supported_precision(spec.weight_precision, gpu, "serving.weight_precision",
                                     given="weight_precision" in table)
        if weight != spec.weight_precision:
            changes["weight_precision"] = weight
    activation = replace(spec, **changes).activation_precision
    if activation not in gpu.peak_flops_per_s:
        changes["compute_precision"] = supported_precision(activation, gpu, "serving activations", given=False)
    if spec.kv_precision == "bf16" and "bf16" not in gpu.peak_flops_per_s:
        if "kv_precision" in table:  # given: an error, as a weight precision the GPU lacks
            supported_precision("bf16", gpu, "serving.kv_precision", given=True)
        changes["kv_precision"] = "fp16"
    return replace(spec, **changes) if changes else spec
