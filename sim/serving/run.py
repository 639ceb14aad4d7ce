"""``simulate_serving``: from a config to a ``ServingResult``. Builds the replicas (memory plan, KV
blocks, scheduler, step-cost model), the router and, for disaggregated serving, the prefill and
decode pools joined by KV transfers over the cluster topology; then runs the SimPy engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import simpy

from hardware.topology import Cluster
from sim.collector import collector_paused
from sim.config import resolve_cluster, resolve_model, section
from sim.errors import ConfigError
from sim.notices import warn
from sim.runner import RunOptions
from sim.serving.batching import InflightScheduler, OrcaScheduler, StaticScheduler
from sim.serving.capacity import ReplicaMemory, replica_memory
from sim.serving.config import (
    ServingSpec, check_model_parallelism, fit_precisions, parse_serving, resolve_replicas, resolve_token_budget,
    serving_gpus,
)
from sim.serving.engine import (
    AcceptanceSampler, Replica, Router, StageCost, StepCost, StepEvent, admit, arrivals, one_token,
)
from sim.serving.kv_cache import BlockManager
from sim.serving.plan import StepPlan
from sim.serving.metrics import parse_slo
from sim.serving.request import SimRequest, Status
from sim.serving.result import ServingResult
from sim.serving.schedulers import BatchLimits, VllmScheduler
from sim.serving.stepcost import ReplicaShape, StepCostModel, decode_attention_kernel
from workloads.catalog import get_model
from workloads.errors import ModelCatalogError
from workloads.model import ModelSpec
from workloads.requests import RequestSpec, build_requests, parse_workload


def prompt_block_hashes(spec: RequestSpec, block_size: int) -> tuple[int, ...]:
    """The request's prefix hashes re-cut into KV blocks of ``block_size`` tokens: a KV block is
    cacheable when the workload's hashed prefix covers it entirely; its key is the workload hash of
    the block holding its last token plus its end offset inside that block (workload hashes already
    identify the whole prefix up to their block, as Mooncake's hash_ids do)."""
    if not spec.prefix_hashes:
        return ()
    unit = spec.prefix_block_tokens
    covered = len(spec.prefix_hashes) * unit
    if unit == block_size:
        return spec.prefix_hashes
    hashes = []
    for end in range(block_size, covered + 1, block_size):
        owner = spec.prefix_hashes[(end - 1) // unit]
        hashes.append(hash((owner, end % unit)))
    return tuple(hashes)


@dataclass(slots=True, kw_only=True)
class Pool:
    """Replicas of one role sharing a shape (and one step-cost model, so its caches are shared)."""

    role: str
    shape: ReplicaShape
    memory: ReplicaMemory
    cost: StepCostModel
    replicas: list[Replica] = field(default_factory=list)


def _limits(spec: ServingSpec, memory: ReplicaMemory, prefill_only: bool = False) -> BatchLimits:
    sarathi = spec.scheduler == "sarathi"
    swap_blocks = int(spec.swap_space_bytes // (memory.block_size * memory.kv_bytes_per_token))
    k = spec.speculative.num_speculative_tokens if spec.speculative and not prefill_only else 0
    return BatchLimits(
        max_num_seqs=spec.max_num_seqs,
        max_batched_tokens=spec.chunk_size if sarathi else spec.max_batched_tokens,
        chunked_prefill=True if sarathi else (spec.chunked_prefill and spec.scheduler not in ("orca", "static")),
        decode_first=sarathi,
        prefill_only=prefill_only,
        speculative_tokens=k,
        preemption_mode=spec.preemption_mode,
        swap_capacity_blocks=swap_blocks,
    )


def make_scheduler(spec: ServingSpec, model: ModelSpec, blocks: BlockManager, limits: BatchLimits):  # type: ignore[no-untyped-def]
    """The scheduler object ``spec.scheduler`` names, over ``blocks``."""
    if spec.scheduler == "static":
        return StaticScheduler(limits, blocks)
    if spec.scheduler == "orca":
        return OrcaScheduler(limits, blocks, reserve_tokens=spec.max_model_len or model.max_seq_len)
    if spec.scheduler == "inflight":
        return InflightScheduler(limits, blocks, reserve_tokens=0)
    return VllmScheduler(limits, blocks)


def _draft_cost(spec: ServingSpec, shape: ReplicaShape) -> StepCostModel | None:
    if spec.speculative is None or spec.speculative.method != "draft":
        return None
    try:
        draft_model = get_model(str(spec.speculative.draft_model))
    except ModelCatalogError as exc:
        raise ConfigError(f"serving.speculative.draft_model: {exc}") from None
    draft_shape = ReplicaShape(
        model=draft_model, cluster=shape.cluster, tp=shape.tp, pp=1, weight_precision=shape.weight_precision,
        kv_precision=shape.kv_precision, activation_precision=shape.activation_precision, first_rank=shape.first_rank,
    )
    return StepCostModel(draft_shape, step_overhead_s=0.0, request_overhead_s=0.0)


@dataclass(slots=True, kw_only=True)
class ServingSystem:
    """Everything one run simulates, ready for ``run``."""

    spec: ServingSpec
    model: ModelSpec
    cluster: Cluster
    pools: list[Pool]
    step_cost_override: StepCost | None = None
    capacity_blocks_override: int | None = None
    stage_cost_override: StageCost | None = None


def spec_replica_memory(spec: ServingSpec, shape: ReplicaShape, *, max_num_seqs: int, max_batched_tokens: int) -> ReplicaMemory:
    """The memory plan of one replica of ``shape`` under the serving stack's rules (``spec``: its KV
    budget rule, runtime reserve, sampling buffers and longest sequence)."""
    return replica_memory(
        shape, gpu_memory_utilization=spec.gpu_memory_utilization, block_size=spec.block_size,
        max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs, kv_cache_memory=spec.kv_cache_memory,
        gathered_logits=spec.tp_logits == "all_gather", runtime_reserve_bytes=spec.runtime_reserve_bytes,
        decoder_buffers=spec.decoder_buffers, max_seq_len=spec.max_model_len or shape.model.max_seq_len,
    )


def build_system(
    spec: ServingSpec, model: ModelSpec, cluster: Cluster, *, step_cost: StepCost | None = None,
    capacity_blocks: int | None = None, stage_cost: StageCost | None = None,
) -> ServingSystem:
    """Pools of replica shapes with their memory plans and cost models (no SimPy yet)."""
    roles: list[tuple[str, int, int, int]]  # (role, tp, ep, count)
    if spec.scheduler == "disaggregated":
        d = spec.disaggregated
        assert d is not None  # parse_serving fills it for this scheduler
        roles = [("prefill", d.prefill_tp, 1, d.prefill_replicas), ("decode", d.decode_tp, 1, d.decode_replicas)]
    else:
        roles = [("replica", spec.tp, spec.ep, spec.replicas)]
    needed = sum(tp * ep * spec.pp * count for _, tp, ep, count in roles)
    if cluster.num_gpus < needed:
        raise ConfigError(
            f"[cluster] num_gpus = {cluster.num_gpus} is too small: the serving layout needs {needed} GPUs "
            f"({', '.join(f'{n} {r} x tp {t} x ep {e} x pp {spec.pp}' for r, t, e, n in roles)})"
        )
    pools: list[Pool] = []
    first = 0
    for role, tp, ep, count in roles:
        shape = ReplicaShape(
            model=model, cluster=cluster, tp=tp, pp=spec.pp, ep=ep, weight_precision=spec.weight_precision,
            kv_precision=spec.kv_precision, activation_precision=spec.activation_precision, first_rank=first,
        )
        memory = spec_replica_memory(
            spec, shape, max_num_seqs=spec.max_num_seqs,
            max_batched_tokens=spec.chunk_size if spec.scheduler == "sarathi" else spec.max_batched_tokens,
        )
        overhead = spec.speculative.draft_free_overhead if spec.speculative else 0.0
        cost = StepCostModel(
            shape, step_overhead_s=spec.step_overhead_s, request_overhead_s=spec.request_overhead_s,
            draft=_draft_cost(spec, shape) if role != "prefill" else None, draft_free_overhead=overhead,
            decode_attention=decode_attention_kernel(spec.decode_attention, shape.model, shape.tp),
            tp_all_reduce=spec.tp_all_reduce, custom_all_reduce_max_bytes=spec.custom_all_reduce_max_bytes,
            cuda_graph_padding=spec.cuda_graph_padding, tp_logits=spec.tp_logits,
            custom_all_reduce_launch=spec.custom_all_reduce_launch,
            api_server_token_overhead_s=spec.api_server_token_overhead_s if spec.api_server else 0.0,
        )
        pools.append(Pool(role=role, shape=shape, memory=memory, cost=cost))
        first += shape.num_gpus * count
    return ServingSystem(
        spec=spec, model=model, cluster=cluster, pools=pools, step_cost_override=step_cost,
        capacity_blocks_override=capacity_blocks, stage_cost_override=stage_cost,
    )


def pipeline_stage_cost(cost: StepCostModel, stages: int) -> StageCost:
    """Split a step of ``cost`` over ``stages`` pipeline stages: the CPU overheads (per step and per
    request) on the host before stage 0, the ``stages - 1`` activation hops between stages, and the
    GPU work in equal shares per stage. Equal shares are an approximation: layers split evenly, but
    the embedding (a lookup) sits on the first stage and the LM head and sampler on the last (Llama-3-70B:
    head 128,256 x 8,192 = 1.05 B weights ~ 1.2 layers of 0.86 B, so on 8 stages of 10 layers the last
    does ~12 % more than the mean in decode); the step's total latency is exact either way."""

    def stage_times(plan: StepPlan) -> tuple[float, float, float]:
        total_s = cost.step_time_s(plan)
        host_s = cost.host_time_s(plan)
        hop_s = cost.pipeline_hop_s(plan.num_tokens) if plan.chunks else 0.0
        gpu_s = max(total_s - host_s - (stages - 1) * hop_s, 0.0)
        return host_s, gpu_s / stages, hop_s

    return stage_times


def _constant_split(step_cost: StepCost, stages: int) -> StageCost:
    """A given whole-step cost spread evenly over the stages, no host time and no hops."""
    return lambda plan: (0.0, step_cost(plan) / stages, 0.0)


def run(
    system: ServingSystem, requests: Sequence[SimRequest], *, rng: np.random.Generator, trace: bool = False,
) -> tuple[list[Replica], list[SimRequest], list[StepEvent]]:
    """Simulate ``requests`` (sorted by arrival) on ``system``; return replicas, rejected requests and
    the step events (empty unless ``trace``)."""
    spec = system.spec
    env = simpy.Environment()
    events: list[StepEvent] | None = [] if trace else None
    rejected: list[SimRequest] = []
    accepted: Callable[[SimRequest, int], int] = one_token
    if spec.speculative is not None:
        accepted = AcceptanceSampler(spec.speculative.acceptance_rate, rng)
    decode_router: Router | None = None
    disaggregated = spec.scheduler == "disaggregated"
    all_replicas: list[Replica] = []

    def finished(replica: Replica, request: SimRequest) -> None:
        if request.status == Status.TRANSFERRING:
            env.process(transfer(replica, request))

    prefill_pool = system.pools[0]
    links: dict[int, simpy.Resource] = {}

    def transfer(source: Replica, request: SimRequest):  # type: ignore[no-untyped-def]
        """Move the request's KV from a prefill replica to a decode replica, then hand it over."""
        assert decode_router is not None
        target = decode_router.pick(request)
        reason = target.scheduler.can_ever_fit(request)
        link = links.setdefault(source.index, simpy.Resource(env, capacity=1))
        with link.request() as hold:
            yield hold
            start = env.now
            src = prefill_pool.shape.first_rank + source.index * prefill_pool.shape.num_gpus
            dst = system.pools[1].shape.first_rank + (target.index - len(prefill_pool.replicas)) * system.pools[1].shape.num_gpus
            bandwidth_Bps, latency_s = system.cluster.p2p_links(src, dst)
            # every prefill rank sends its own KV shard in parallel over its own link
            shard_bytes = request.computed * prefill_pool.memory.kv_bytes_per_token
            yield env.timeout(latency_s + shard_bytes / bandwidth_Bps)
            request.kv_transfer_s = env.now - start
        source.scheduler.release(request)
        source.kick()
        request.prefill_replica = source.index
        if reason:
            request.status = Status.REJECTED
            request.reject_reason = reason
            rejected.append(request)
            return
        target.submit(request)

    index = 0
    for pool in system.pools:
        blocks_count = system.capacity_blocks_override if system.capacity_blocks_override is not None else pool.memory.num_blocks
        count = spec.replicas if pool.role == "replica" else (
            spec.disaggregated.prefill_replicas if pool.role == "prefill" else spec.disaggregated.decode_replicas  # type: ignore[union-attr]
        )
        block_bytes = pool.memory.block_size * pool.memory.kv_bytes_per_token
        h2d_Bps = system.cluster.node.host_to_device_Bps
        for _ in range(count):
            blocks = BlockManager(blocks_count, spec.block_size, prefix_caching=spec.prefix_caching)
            limits = _limits(spec, pool.memory, prefill_only=pool.role == "prefill")
            scheduler = make_scheduler(spec, system.model, blocks, limits)
            stage_cost: StageCost | None = None
            if spec.pp > 1:
                if system.stage_cost_override is not None:
                    stage_cost = system.stage_cost_override
                elif system.step_cost_override is not None:
                    stage_cost = _constant_split(system.step_cost_override, spec.pp)
                else:
                    stage_cost = pipeline_stage_cost(pool.cost, spec.pp)
            replica = Replica(
                env, index, scheduler, system.step_cost_override or pool.cost.step_time_s,
                on_leave=finished, accepted=accepted if pool.role != "prefill" else one_token,
                swap_time_s=lambda b, bb=block_bytes, bw=h2d_Bps: b * bb / bw, trace=events, role=pool.role,
                stages=spec.pp, stage_cost=stage_cost,
            )
            pool.replicas.append(replica)
            all_replicas.append(replica)
            index += 1
    router = Router(spec.router, prefill_pool.replicas)
    if disaggregated:
        decode_router = Router("least_outstanding", system.pools[1].replicas)
    env.process(arrivals(env, requests, lambda r: admit(router, r, rejected)))
    # every step allocates a chunk per scheduled request next to the long-lived requests and their
    # token times: with the collector on, its full collections re-walked them all and took more than
    # half of a 30,000-request TensorRT-LLM row's CPU time (4.2 of 7.8 s) while freeing nothing (the
    # run leaves about 500 objects in cycles; peak memory unchanged)
    with collector_paused():
        env.run()
    return all_replicas, rejected, events or []


def check_context(requests: Sequence[RequestSpec], spec: ServingSpec, model: ModelSpec, table: Mapping[str, Any]) -> None:
    """A prompt longer than the context (``max_model_len``, default the model's trained length) is an
    error when every request has it (a fixed length); a warning with the count when only some do."""
    limit = spec.max_model_len or model.max_seq_len
    field = "serving.max_model_len" if spec.max_model_len else f"the {model.name} max_seq_len"
    prompt = table.get("prompt_tokens")
    if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > limit:
        raise ConfigError(f"workload.prompt_tokens = {prompt} is longer than the {limit}-token context ({field})")
    long = sum(1 for r in requests if r.prompt_tokens + r.output_tokens > limit)
    if long:
        warn(f"{long} of {len(requests)} requests have prompt + output tokens past the {limit}-token context ({field}); "
             "they are simulated as given")


def check_room_for_kv(system: ServingSystem) -> None:
    """Nothing can be served when a pool's weights and workspace leave no room for one KV block: say
    so once, with the sizes and what would help (instead of one rejection per request)."""
    gib = 2**30
    for pool in system.pools:
        m = pool.memory
        if m.fits:
            continue
        raise ConfigError(
            f"no room for the KV cache on {pool.role} (tp {pool.shape.tp}, pp {pool.shape.pp}, "
            f"{system.spec.weight_precision} weights): weights need {m.weights_bytes / gib:.2f} GiB and workspace "
            f"{(m.workspace_bytes + m.comm_bytes + m.runtime_bytes) / gib:.2f} GiB of the {m.budget_bytes / gib:.2f} GiB per GPU the engine may use "
            f"(serving.gpu_memory_utilization {system.spec.gpu_memory_utilization} x {system.cluster.gpu.engine_memory_bytes / gib:.2f} GiB of device memory); "
            f"short {m.shortfall_bytes / gib:.2f} GiB: raise serving.tp or pp, or use a smaller weight_precision"
        )


def simulate_serving(
    config: Mapping[str, Any], options: RunOptions, request_specs: Sequence[RequestSpec] | None = None
) -> ServingResult:
    """The serving run a config describes ([model], [cluster], [serving], [workload], [slo]);
    ``request_specs`` (a part of a stream that a router upstream sent here) replaces the stream that
    ``[workload]`` would generate."""
    spec = parse_serving(section(config, "serving"))
    workload = parse_workload(section(config, "workload"), base_dir=options.config_dir)
    seed = options.seed if options.seed is not None else (workload.seed if workload.seed is not None else 0)
    rng = np.random.default_rng(seed)
    if request_specs is None:
        request_specs = build_requests(workload, rng)
    # an inline model without max_seq_len serves the run's longest request (or max_model_len)
    longest = spec.max_model_len or max((r.prompt_tokens + r.output_tokens for r in request_specs), default=None)
    model = resolve_model(config, default_max_seq_len=longest)
    check_model_parallelism(spec, model)
    slo = parse_slo(section(config, "slo", required=False))
    spec, derived = resolve_replicas(spec, section(config, "serving"), section(config, "cluster").get("num_gpus"))
    cluster = resolve_cluster(config, default_num_gpus=serving_gpus(spec))
    spec = fit_precisions(spec, section(config, "serving"), cluster.gpu)
    spec = resolve_token_budget(spec, section(config, "serving"), model.max_seq_len)
    check_context(request_specs, spec, model, section(config, "workload"))
    system = build_system(spec, model, cluster)
    check_room_for_kv(system)
    requests = to_sim_requests(request_specs, spec.block_size)
    replicas, rejected, events = run(system, requests, rng=rng, trace=options.trace)
    return ServingResult(
        system=system, requests=requests, replicas=replicas, events=events, slo=slo,
        offered_rate_per_s=workload.rate_per_s if workload.arrival in ("poisson", "gamma") else None,
        replicas_derived=derived, seed=seed,
    )


def to_sim_requests(specs: Sequence[RequestSpec], block_size: int) -> list[SimRequest]:
    """Simulator requests from a workload stream, sorted by arrival."""
    ordered = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
    return [
        SimRequest(s.request_id, s.arrival_s, s.prompt_tokens, s.output_tokens,
                   prompt_block_hashes(s, block_size), s.session_id)
        for s in ordered
    ]
