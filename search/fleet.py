"""``[search] goal = "fleet"``: the cheapest serving fleet that meets the SLO at a target rate (or the
most goodput within a budget), over GPU types, instance shapes and prefill/decode pools.

1. Capacity of each instance shape (and size bucket): the highest Poisson rate at which one instance
   meets the SLO (attainment >= percentile, not saturated), by doubling then bisection with the
   serving DES (``sim.serving.run.simulate_serving``, the path ``llmsim simulate`` runs) on a fixed
   seed. A prefill-role instance is measured against the TTFT limit with decode instances to spare,
   a decode-role instance against the TPOT limit with prefill instances to spare. Capacities are
   cached by (shape, bucket, workload, SLO).
2. A MILP (PuLP, HiGHS): integer instance counts per option (a shape, or a prefill + decode pair on one
   GPU type whose counts follow from each role's capacity), the traffic of each prompt-size bucket
   split over options (Mélange, Griggs et al. 2024: small requests may go to cheap GPUs), each
   option's counts covering its share at its measured capacity, GPUs per type within availability.
   Objective: hourly cost, or (``objective = "goodput"``) the served rate within ``budget_per_hour``.
3. The chosen fleet is re-simulated behind a router (requests of a bucket go to options in proportion
   to their share, by smooth weighted round robin; round robin inside an option); when it misses the
   SLO, the capacities of the group that did worst are lowered by 10 %, the MILP is solved again
   (adding instances within the availability caps) and the new fleet simulated (each repair reported).
   Runner-ups and the per-GPU-type fleets are solved on the same (possibly lowered) capacities.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pulp

from hardware.catalog import get_gpu, get_node
from hardware.errors import CatalogError
from search.executor import map_batches
from search.progress import progress
from search.run import DEFAULT_TOP_K, SearchOptions
from search.solver import solve_checked
from sim.config import reject_unknown_keys, resolve_model, section
from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.serving.analytic import static_batch_times
from sim.serving.config import SCHEDULERS, parse_serving
from sim.serving.metrics import SloSpec, parse_slo, summarize
from sim.serving.run import simulate_serving, spec_replica_memory
from sim.serving.stepcost import ReplicaShape, StepCostModel
from sim.toml_writer import dumps as toml_dumps
from hardware.topology import build_cluster
from hardware.catalog import get_network
from workloads.requests import RequestSpec, build_requests, parse_workload

FLEET_SEARCH_KEYS = (
    "goal", "objective", "top_k", "target_rate_per_s", "budget_per_hour", "gpus", "prices_per_hour",
    "gpu_availability", "instance_tp", "schedulers", "max_num_seqs", "chunk_size", "size_buckets",
    "capacity_requests", "fleet_requests", "max_repairs",
)
OBJECTIVES = ("cost", "goodput")
DEFAULT_SCHEDULERS = ("vllm",)
DEFAULT_INSTANCE_TP = (1, 2, 4, 8)
# Requests per capacity probe: 200 at the percentile 90 leave 20 misses of slack; 95 % CI of an
# attainment of 0.9 on 200 draws is +-4 %.
DEFAULT_CAPACITY_REQUESTS = 200
DEFAULT_FLEET_REQUESTS = 800
DEFAULT_MAX_REPAIRS = 6
# Bisection stops when the met and missed rates are within this ratio.
CAPACITY_TOLERANCE = 1.05
STARTING_BATCH = 32  # batch of the static-batch estimate the bisection starts from
MIN_RATE_PER_S = 1 / 64
MAX_RATE_PER_S = 4096.0
# When the re-simulated fleet misses the SLO, the capacities of its worst group are scaled by this
# and the MILP solved again (more instances, or other shapes, within the availability caps).
REPAIR_DERATE = 0.9
# A role instance is measured with this many instances of the other role, so that the other role is
# never what limits it (one prefill instance feeds several decode instances and the reverse).
HELPER_INSTANCES = 4


# ---- the space -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Shape:
    """One instance: a GPU type, tensor parallelism, scheduler settings and role."""

    gpu: str
    tp: int
    scheduler: str  # the instance's scheduler ("disaggregated" for a prefill or decode role)
    role: str  # "replica" | "prefill" | "decode"
    max_num_seqs: int
    chunk_size: int

    @property
    def label(self) -> str:
        role = "" if self.role == "replica" else f" {self.role}"
        chunk = f" chunk {self.chunk_size}" if self.scheduler == "sarathi" else ""
        return f"{self.gpu} tp{self.tp} {self.scheduler}{role}{chunk} seqs {self.max_num_seqs}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """What the MILP counts: a colocated shape, or a disaggregated prefill + decode pair."""

    gpu: str
    shapes: tuple[Shape, ...]  # (replica,) or (prefill, decode)

    @property
    def disaggregated(self) -> bool:
        return len(self.shapes) == 2

    @property
    def label(self) -> str:
        if not self.disaggregated:
            return self.shapes[0].label
        p, d = self.shapes
        return f"{self.gpu} disaggregated prefill tp{p.tp} + decode tp{d.tp} seqs {p.max_num_seqs}"


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSpace:
    config: Mapping[str, Any]  # the user's config (workers rebuild everything from it)
    objective: str
    target_rate_per_s: float
    budget_per_hour: float | None
    prices_per_hour: Mapping[str, float]  # per GPU
    price_sources: Mapping[str, str]
    availability: Mapping[str, int]  # GPUs per type (absent: unlimited)
    shapes: tuple[Shape, ...]
    options: tuple[Option, ...]
    buckets: tuple[tuple[int, int], ...]  # (lowest, highest) prompt tokens of each size bucket
    bucket_shares: tuple[float, ...]
    slo: SloSpec
    capacity_requests: int
    fleet_requests: int
    max_repairs: int
    top_k: int
    pruned: Mapping[str, int]


def _list(table: Mapping[str, Any], key: str, default: Sequence[Any], kind: type, allowed: Sequence[Any] | None = None) -> tuple:
    value = table.get(key, list(default))
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise ConfigError(f"search.{key} = [] must list at least one value")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, kind) or (kind is int and item < 1):
            raise ConfigError(f"search.{key} = {value!r}: {item!r} must be a {'positive integer' if kind is int else kind.__name__}")
        if allowed is not None and item not in allowed:
            raise ConfigError(f"search.{key} = {item!r}; allowed: {', '.join(map(str, allowed))}")
    return tuple(dict.fromkeys(value))


def _positive(table: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"search.{key} = {value!r} must be a positive finite number")
    return float(value)


def _prices(table: Mapping[str, Any], gpus: Sequence[str]) -> tuple[dict[str, float], dict[str, str]]:
    given = table.get("prices_per_hour", {})
    if not isinstance(given, Mapping):
        raise ConfigError(f"search.prices_per_hour = {given!r} must be a table of GPU name = USD per GPU-hour")
    for name, value in given.items():
        if name not in gpus:
            raise ConfigError(f"search.prices_per_hour: '{name}' is not in search.gpus ({', '.join(gpus)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"search.prices_per_hour.{name} = {value!r} must be a positive number (USD per GPU-hour)")
    prices, sources = {}, {}
    for name in gpus:
        if name in given:
            prices[name], sources[name] = float(given[name]), "search.prices_per_hour"
            continue
        gpu = get_gpu(name)
        if gpu.price_per_hour_usd is None:
            raise ConfigError(
                f"search.gpus: '{name}' has no catalog price; give search.prices_per_hour.{name} (USD per GPU-hour)"
            )
        prices[name], sources[name] = gpu.price_per_hour_usd, gpu.price_source or "catalog"
    return prices, sources


def _buckets(table: Mapping[str, Any], prompts: np.ndarray) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    edges = table.get("size_buckets", [])
    if not isinstance(edges, list) or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in edges):
        raise ConfigError(f"search.size_buckets = {edges!r} must be a list of prompt-token boundaries (positive integers)")
    edges = sorted(set(edges))
    bounds, low = [], 1
    for edge in edges:
        bounds.append((low, edge))
        low = edge + 1
    bounds.append((low, 2**62))
    shares = tuple(float(np.mean((prompts >= lo) & (prompts <= hi))) for lo, hi in bounds)
    kept = [(b, s) for b, s in zip(bounds, shares) if s > 0]
    return tuple(b for b, _ in kept), tuple(s for _, s in kept)


def _serving_base(config: Mapping[str, Any]) -> dict[str, Any]:
    """The user's [serving] table minus what the planner chooses."""
    base = dict(section(config, "serving", required=False) or {})
    for key in ("tp", "scheduler", "replicas", "disaggregated", "max_num_seqs", "chunk_size"):
        base.pop(key, None)
    return base


def parse_fleet(config: Mapping[str, Any], options: SearchOptions) -> FleetSpace:
    table = section(config, "search")
    reject_unknown_keys(table, "search", FLEET_SEARCH_KEYS)
    if "cluster" in config:
        raise ConfigError("[cluster]: the fleet planner chooses the GPUs (list them in search.gpus); remove [cluster]")
    objective = table.get("objective", "cost")
    if objective not in OBJECTIVES:
        raise ConfigError(f"search.objective = {objective!r}; allowed for goal 'fleet': {', '.join(OBJECTIVES)}")
    target = _positive(table, "target_rate_per_s", None)
    if target is None:
        raise ConfigError("search.target_rate_per_s is required for goal 'fleet' (requests per second to serve)")
    budget = _positive(table, "budget_per_hour", None)
    if objective == "goodput" and budget is None:
        raise ConfigError("search.objective = 'goodput' needs search.budget_per_hour (USD per hour)")
    slo = parse_slo(section(config, "slo", required=False))
    if slo is None:
        raise ConfigError("[slo] is required for goal 'fleet' (ttft_s, tpot_s and/or e2e_s, and percentile)")
    gpus = _list(table, "gpus", (), str)
    for name in gpus:
        try:
            get_node(get_gpu(name).default_node)
        except CatalogError as exc:
            raise ConfigError(f"search.gpus: {exc}") from None
    prices, sources = _prices(table, gpus)
    availability = table.get("gpu_availability", {})
    if not isinstance(availability, Mapping) or any(
        name not in gpus or isinstance(v, bool) or not isinstance(v, int) or v < 0 for name, v in availability.items()
    ):
        raise ConfigError(f"search.gpu_availability = {availability!r} must map GPU names of search.gpus to GPU counts >= 0")
    tps = _list(table, "instance_tp", DEFAULT_INSTANCE_TP, int)
    schedulers = _list(table, "schedulers", DEFAULT_SCHEDULERS, str, SCHEDULERS)
    seqs = _list(table, "max_num_seqs", (256,), int)
    chunks = _list(table, "chunk_size", (512,), int)
    model = resolve_model(config)
    base = _serving_base(config)
    spec = parse_serving(base)
    workload = parse_workload(section(config, "workload"), base_dir=options.config_dir)
    if workload.arrival not in ("poisson", "gamma"):
        raise ConfigError(f"workload.arrival = {workload.arrival!r}: the fleet planner scales a poisson or gamma stream to each rate")
    sample = build_requests(replace(workload, rate_per_s=1.0, num_requests=2000), np.random.default_rng(_seed(workload, options)))
    prompts = np.array([r.prompt_tokens for r in sample])
    buckets, shares = _buckets(table, prompts)
    pruned: dict[str, int] = {}
    shapes: list[Shape] = []
    for gpu_name in gpus:
        gpu = get_gpu(gpu_name)
        node = get_node(gpu.default_node)
        for tp in tps:
            if model.heads % tp or (model.kv_heads % tp and tp % model.kv_heads):
                pruned["tp_does_not_divide_heads"] = pruned.get("tp_does_not_divide_heads", 0) + len(schedulers)
                continue
            if tp > node.gpus_per_node:
                pruned["tp_exceeds_node"] = pruned.get("tp_exceeds_node", 0) + len(schedulers)
                continue
            cluster = build_cluster(gpu, node, get_network(node.default_network), tp)
            rshape = ReplicaShape(model=model, cluster=cluster, tp=tp, weight_precision=spec.weight_precision,
                                  kv_precision=spec.kv_precision, activation_precision=spec.activation_precision)
            for scheduler in schedulers:
                roles = ("prefill", "decode") if scheduler == "disaggregated" else ("replica",)
                for num_seqs in seqs:
                    for chunk in (chunks if scheduler == "sarathi" else (chunks[0],)):
                        memory = spec_replica_memory(
                            spec, rshape, max_num_seqs=num_seqs,
                            max_batched_tokens=chunk if scheduler == "sarathi" else spec.max_batched_tokens,
                        )
                        if not memory.fits:
                            pruned["does_not_fit_in_memory"] = pruned.get("does_not_fit_in_memory", 0) + 1
                            continue
                        for role in roles:
                            shapes.append(Shape(gpu=gpu_name, tp=tp, scheduler=scheduler, role=role,
                                                max_num_seqs=num_seqs, chunk_size=chunk))
    options_list: list[Option] = [Option(gpu=s.gpu, shapes=(s,)) for s in shapes if s.role == "replica"]
    for p in (s for s in shapes if s.role == "prefill"):
        for d in (s for s in shapes if s.role == "decode" and s.gpu == p.gpu and s.max_num_seqs == p.max_num_seqs):
            options_list.append(Option(gpu=p.gpu, shapes=(p, d)))
    top_k = options.top_k or table.get("top_k", DEFAULT_TOP_K)
    return FleetSpace(
        config=config, objective=objective, target_rate_per_s=target, budget_per_hour=budget,
        prices_per_hour=prices, price_sources=sources, availability=dict(availability), shapes=tuple(shapes),
        options=tuple(options_list), buckets=buckets, bucket_shares=shares, slo=slo,
        capacity_requests=_count(table, "capacity_requests", DEFAULT_CAPACITY_REQUESTS),
        fleet_requests=_count(table, "fleet_requests", DEFAULT_FLEET_REQUESTS),
        max_repairs=_count(table, "max_repairs", DEFAULT_MAX_REPAIRS, minimum=0), top_k=_count({"top_k": top_k}, "top_k", 1),
        pruned=pruned,
    )


def _count(table: Mapping[str, Any], key: str, default: int, minimum: int = 1) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"search.{key} = {value!r} must be an integer >= {minimum}")
    return value


def _seed(workload: Any, options: SearchOptions) -> int:
    return workload.seed if workload.seed is not None else options.seed


# ---- simulating instances and fleets ---------------------------------------------------------------


def serving_config(config: Mapping[str, Any], option: Option, counts: Sequence[int], rate_per_s: float,
                   num_requests: int, slo: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A complete `llmsim simulate` config: ``counts`` instances of ``option`` at ``rate_per_s``."""
    first = option.shapes[0]
    serving = _serving_base(config)
    serving.update(max_num_seqs=first.max_num_seqs, router="round_robin")
    if option.disaggregated:
        p, d = option.shapes
        serving.update(scheduler="disaggregated", tp=p.tp, disaggregated={
            "prefill_replicas": counts[0], "decode_replicas": counts[1], "prefill_tp": p.tp, "decode_tp": d.tp})
        gpus = counts[0] * p.tp + counts[1] * d.tp
    else:
        serving.update(scheduler=first.scheduler, tp=first.tp, replicas=counts[0])
        if first.scheduler == "sarathi":
            serving["chunk_size"] = first.chunk_size
        gpus = counts[0] * first.tp
    workload = dict(section(config, "workload"))
    workload.update(rate_per_s=rate_per_s, num_requests=num_requests)
    out = {key: value for key, value in config.items()
           if key not in ("search", "cluster", "serving", "workload", "slo") and not key.startswith("_")}
    out.update(cluster={"gpu": option.gpu, "num_gpus": gpus}, serving=serving, workload=workload,
               slo=dict(slo if slo is not None else section(config, "slo")))
    return out


def _stream(config: Mapping[str, Any], rate_per_s: float, num_requests: int, bucket: tuple[int, int] | None,
            share: float, seed: int) -> list[RequestSpec]:
    """``num_requests`` of the workload at ``rate_per_s`` (of the bucket's requests only: the whole
    stream is drawn at rate / share and filtered, so the bucket keeps its own length mix)."""
    workload = parse_workload(section(config, "workload"))
    total = int(math.ceil(num_requests / share)) if bucket is not None else num_requests
    specs = build_requests(replace(workload, rate_per_s=rate_per_s / share if bucket else rate_per_s,
                                   num_requests=total), np.random.default_rng(seed))
    if bucket is not None:
        specs = [s for s in specs if bucket[0] <= s.prompt_tokens <= bucket[1]]
    return specs


def _role_slo(slo: SloSpec, role: str) -> dict[str, Any]:
    limits = {"ttft_s": slo.ttft_s} if role == "prefill" else {"tpot_s": slo.tpot_s} if role == "decode" else {
        "ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s}
    out = {k: v for k, v in limits.items() if v is not None}
    if not out:  # e.g. a decode role under an SLO with only a TTFT limit: nothing for it to miss
        out = {k: v for k, v in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)) if v is not None}
    out["percentile"] = slo.percentile
    return out


def _meets(config: Mapping[str, Any], shape: Shape, bucket: tuple[int, int] | None, share: float, rate: float,
           requests: int, slo: SloSpec, seed: int) -> bool:
    """One instance of ``shape`` (a role instance with helpers of the other role) at ``rate``."""
    option = Option(gpu=shape.gpu, shapes=(shape,))
    counts: tuple[int, ...] = (1,)
    if shape.role != "replica":
        partner = replace(shape, role="decode" if shape.role == "prefill" else "prefill")
        pair = (shape, partner) if shape.role == "prefill" else (partner, shape)
        option = Option(gpu=shape.gpu, shapes=pair)
        counts = (1, HELPER_INSTANCES) if shape.role == "prefill" else (HELPER_INSTANCES, 1)
    role_slo = _role_slo(slo, shape.role)
    cfg = serving_config(config, option, counts, rate, requests, role_slo)
    specs = _stream(config, rate, requests, bucket, share, seed)
    result = simulate_serving(cfg, RunOptions(seed=seed), specs)
    metrics = summarize(result.records(), slo=parse_slo(role_slo), offered_rate_per_s=rate)
    return bool(metrics["slo_met"]) and not metrics["saturated"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    shape: Shape
    bucket: int
    rate_per_s: float  # highest rate met (0: not even MIN_RATE_PER_S)
    probes: int


def _capacity_batch(tasks: Sequence[tuple[str, Shape, int]]) -> list[Capacity]:
    """Capacities of (config JSON, shape, bucket index) tasks (top level: runs in worker processes)."""
    return [_capacity(*task) for task in tasks]


@lru_cache(maxsize=4096)
def _capacity(config_json: str, shape: Shape, bucket_index: int) -> Capacity:
    """Doubling or halving from ``start_rate_per_s`` to bracket the capacity, then bisection to
    CAPACITY_TOLERANCE."""
    config = json.loads(config_json)
    space_table = section(config, "search")
    workload = parse_workload(section(config, "workload"))
    seed = workload.seed if workload.seed is not None else int(config.get("_seed", 0))
    slo = parse_slo(section(config, "slo"))
    assert slo is not None
    buckets = config["_buckets"]
    bucket = tuple(buckets[bucket_index]) if len(buckets) > 1 else None
    share = config["_shares"][bucket_index] if len(buckets) > 1 else 1.0
    requests = int(space_table.get("capacity_requests", DEFAULT_CAPACITY_REQUESTS))
    probes = 0

    def met(rate: float) -> bool:
        nonlocal probes
        probes += 1
        return _meets(config, shape, bucket, share, rate, requests, slo, seed)  # type: ignore[arg-type]

    rate = start_rate_per_s(config, shape)
    if met(rate):
        low, high = rate, None
        while high is None and low < MAX_RATE_PER_S:
            if met(low * 2):
                low *= 2
            else:
                high = low * 2
        if high is None:
            return Capacity(shape=shape, bucket=bucket_index, rate_per_s=low, probes=probes)
    else:
        low, high = 0.0, rate
        while low == 0.0 and high / 2 >= MIN_RATE_PER_S:
            if met(high / 2):
                low = high / 2
            else:
                high /= 2
        if low == 0.0:
            return Capacity(shape=shape, bucket=bucket_index, rate_per_s=0.0, probes=probes)
    while high / low > CAPACITY_TOLERANCE:
        middle = math.sqrt(low * high)
        if met(middle):
            low = middle
        else:
            high = middle
    return Capacity(shape=shape, bucket=bucket_index, rate_per_s=low, probes=probes)


def _task_config(space: FleetSpace, options: SearchOptions) -> str:
    """The config the workers rebuild from: the user's, plus the buckets and the seed."""
    config = dict(space.config)
    config["_buckets"] = [list(b) for b in space.buckets]
    config["_shares"] = list(space.bucket_shares)
    config["_seed"] = options.seed
    return json.dumps(config, sort_keys=True, default=str)


# ---- the MILP --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Instances of one option in a fleet and the share of each bucket routed to them."""

    option: Option
    counts: tuple[int, ...]  # (replicas,) or (prefill, decode)
    shares: tuple[float, ...]  # per bucket

    @property
    def gpus(self) -> int:
        return sum(c * s.tp for c, s in zip(self.counts, self.option.shapes))


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    label: str
    groups: tuple[Group, ...]
    cost_per_hour: float
    served_rate_per_s: float

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.option.gpu] = out.get(g.option.gpu, 0) + g.gpus
        return out


def fleet_milp(space: FleetSpace, capacities: Mapping[tuple[Shape, int], float], rate_per_s: float,
               allowed: Sequence[Option] | None = None) -> tuple[pulp.LpProblem, dict, dict] | None:
    """The MILP over ``allowed`` options (default all) at ``rate_per_s``; None when no option serves
    some bucket at all."""
    # an option is usable when all its roles serve at least one bucket
    options = [o for o in (allowed if allowed is not None else space.options)
               if any(all(capacities.get((s, b), 0.0) > 0 for s in o.shapes) for b in range(len(space.buckets)))]
    if not options:
        return None
    goodput = space.objective == "goodput"
    problem = pulp.LpProblem("fleet", pulp.LpMaximize if goodput else pulp.LpMinimize)
    counts: dict[tuple[int, int], pulp.LpVariable] = {}
    split: dict[tuple[int, int], pulp.LpVariable] = {}
    for i, option in enumerate(options):
        for r in range(len(option.shapes)):
            counts[i, r] = problem.add_variable(f"count_{i}_{r}", lowBound=0, cat="Integer")
        for b in range(len(space.buckets)):
            if all(capacities.get((s, b), 0.0) > 0 for s in option.shapes):
                split[b, i] = problem.add_variable(f"share_{b}_{i}", lowBound=0, upBound=1)
    cost = pulp.lpSum(space.prices_per_hour[o.gpu] * s.tp * counts[i, r]
                      for i, o in enumerate(options) for r, s in enumerate(o.shapes))
    rates = [rate_per_s * share for share in space.bucket_shares]
    served = pulp.lpSum(rates[b] * v for (b, _), v in split.items())
    if goodput:
        problem += served - 1e-6 * cost  # ties: the cheaper fleet
        problem += (cost <= space.budget_per_hour, "cost_within_budget")
    else:
        problem += cost
    for b in range(len(space.buckets)):
        parts = [v for (bb, _), v in split.items() if bb == b]
        if not parts and not goodput:
            return None  # no option serves this bucket at all
        if goodput:
            problem += (pulp.lpSum(parts) <= 1, f"bucket_{b}_served_at_most_once")
        else:
            problem += (pulp.lpSum(parts) == 1, f"bucket_{b}_fully_served")
    for i, option in enumerate(options):
        for r, shape in enumerate(option.shapes):
            load = pulp.lpSum(rates[b] / capacities[(shape, b)] * split[b, i] for b in range(len(space.buckets)) if (b, i) in split)
            problem += (load <= counts[i, r], f"option_{i}_{shape.role}_covers_its_share")
    for gpu, limit in space.availability.items():
        used = [s.tp * counts[i, r] for i, o in enumerate(options) if o.gpu == gpu for r, s in enumerate(o.shapes)]
        if used:
            problem += (pulp.lpSum(used) <= limit, f"{gpu}_within_availability")
    return problem, {"options": options, "counts": counts, "split": split}, {"rates": rates}


def solve_fleet(space: FleetSpace, capacities: Mapping[tuple[Shape, int], float], rate_per_s: float,
                allowed: Sequence[Option] | None = None, label: str = "best") -> Fleet | None:
    built = fleet_milp(space, capacities, rate_per_s, allowed)
    if built is None:
        return None
    problem, v, extra = built
    solution = solve_checked(problem)
    if solution is None:
        return None
    options, counts, split = v["options"], v["counts"], v["split"]
    groups = []
    cost = served = 0.0
    for i, option in enumerate(options):
        c = tuple(int(round(solution.values.get(counts[i, r].name, 0.0))) for r in range(len(option.shapes)))
        shares = tuple(max(0.0, solution.values.get(split[b, i].name, 0.0)) if (b, i) in split else 0.0
                       for b in range(len(space.buckets)))
        if sum(c) == 0 or sum(shares) <= 1e-9:
            continue
        groups.append(Group(option=option, counts=c, shares=shares))
        cost += sum(space.prices_per_hour[option.gpu] * s.tp * n for s, n in zip(option.shapes, c))
        served += sum(r * s for r, s in zip(extra["rates"], shares))
    return Fleet(label=label, groups=tuple(groups), cost_per_hour=cost, served_rate_per_s=served)


# ---- re-simulation ------------------------------------------------------------------------------------


def _route(specs: Sequence[RequestSpec], space: FleetSpace, fleet: Fleet) -> list[list[RequestSpec]]:
    """The size-aware router: each request to a group serving its bucket, by smooth weighted round
    robin over the groups' shares of that bucket; the share no group takes (goodput objective: what
    the budget does not buy) is shed at the router (left out of every part)."""
    parts: list[list[RequestSpec]] = [[] for _ in fleet.groups]
    credit = np.zeros((len(space.buckets), len(fleet.groups) + 1))
    for spec in specs:
        b = next(i for i, (lo, hi) in enumerate(space.buckets) if lo <= spec.prompt_tokens <= hi)
        served = [g.shares[b] for g in fleet.groups]
        weights = np.array(served + [max(0.0, 1.0 - sum(served))])
        credit[b] += weights
        pick = int(np.argmax(credit[b]))
        credit[b, pick] -= weights.sum()
        if pick < len(fleet.groups):
            parts[pick].append(spec)
    return parts


@dataclass(slots=True, kw_only=True)
class FleetRun:
    fleet: Fleet
    metrics: dict[str, Any]  # serving JSON of the whole fleet
    group_metrics: list[dict[str, Any]]
    group_specs: list[list[RequestSpec]]


def simulate_fleet(space: FleetSpace, fleet: Fleet, seed: int) -> FleetRun:
    """Every group simulated on its share of one stream at the target rate; metrics over all requests."""
    specs = _stream(space.config, space.target_rate_per_s, space.fleet_requests, None, 1.0, seed)
    parts = _route(specs, space, fleet)
    records, group_metrics = [], []
    slo_table = {k: v for k, v in (("ttft_s", space.slo.ttft_s), ("tpot_s", space.slo.tpot_s),
                                   ("e2e_s", space.slo.e2e_s)) if v is not None}
    slo_table["percentile"] = space.slo.percentile
    for group, part in zip(fleet.groups, parts):
        if not part:
            group_metrics.append({"num_requests": 0, "slo_attainment": None, "saturated": False})
            continue
        rate = space.target_rate_per_s * len(part) / len(specs)
        cfg = serving_config(space.config, group.option, group.counts, rate, len(part), slo_table)
        result = simulate_serving(cfg, RunOptions(seed=seed), part)
        group_records = result.records()
        records.extend(group_records)
        group_metrics.append(summarize(group_records, slo=space.slo, offered_rate_per_s=rate))
    admitted = len(records)
    metrics = summarize(records, slo=space.slo, offered_rate_per_s=space.target_rate_per_s * admitted / len(specs))
    good = (metrics["slo_attainment"] or 0.0) * admitted
    metrics["shed_requests"] = len(specs) - admitted  # shed at the router: count as misses
    metrics["admitted_slo_attainment"] = metrics["slo_attainment"]
    metrics["slo_attainment"] = good / len(specs)
    metrics["num_requests"] = len(specs)
    # cost: every request within the SLO at the percentile; goodput: every admitted request
    met_share = metrics["slo_attainment"] if space.objective == "cost" else metrics["admitted_slo_attainment"] or 0.0
    metrics["slo_met"] = met_share >= space.slo.percentile / 100 and not metrics["saturated"]
    return FleetRun(fleet=fleet, metrics=metrics, group_metrics=group_metrics, group_specs=parts)


def _layout(fleet: Fleet) -> tuple:
    """What a re-simulation depends on: options, counts and routing shares (to 0.1 %)."""
    return tuple((g.option, g.counts, tuple(round(s, 3) for s in g.shares)) for g in fleet.groups)


def _worst_group(space: FleetSpace, run: FleetRun) -> int:
    """The group that did worst: lowest attainment, saturated first on ties."""
    scored = [(m["slo_attainment"] if m.get("slo_attainment") is not None else 1.0, -int(bool(m.get("saturated"))), i)
              for i, m in enumerate(run.group_metrics)]
    return min(scored)[2]


def _derate(space: FleetSpace, run: FleetRun, table: dict[tuple[Shape, int], float]) -> str:
    """Lower by REPAIR_DERATE the capacities, on the buckets the worst group serves, of every shape of
    that group's GPU type (of the role that missed, when disaggregated): in the fleet's mix those
    instances sustain less than when measured alone, and derating one shape at a time would only
    swap it for a sibling shape measured the same way. Returns what was derated."""
    worst = _worst_group(space, run)
    group = run.fleet.groups[worst]
    roles = {"replica"}
    if group.option.disaggregated:  # the role whose limit was missed: TTFT -> prefill, else decode
        m = run.group_metrics[worst]
        ttft = (m.get("ttft_s") or {}).get(f"p{space.slo.percentile:g}", (m.get("ttft_s") or {}).get("p90", 0.0))
        roles = {"prefill"} if space.slo.ttft_s is not None and ttft > space.slo.ttft_s else {"decode"}
    shapes = [s for s in space.shapes if s.gpu == group.option.gpu and s.role in roles]
    for shape in shapes:
        for b, share in enumerate(group.shares):
            if share > 0 and (shape, b) in table:
                table[(shape, b)] *= REPAIR_DERATE
    return f"{group.option.gpu} {'/'.join(sorted(roles))} shapes"


# ---- the result --------------------------------------------------------------------------------------


def _instances(space: FleetSpace, group: Group) -> list[dict[str, Any]]:
    out = []
    for shape, count in zip(group.option.shapes, group.counts):
        serving = {"tp": shape.tp, "scheduler": shape.scheduler, "max_num_seqs": shape.max_num_seqs}
        if shape.scheduler == "sarathi":
            serving["chunk_size"] = shape.chunk_size
        out.append({"gpu": shape.gpu, "count": count, "role": shape.role, "serving": serving,
                    "bucket_shares": list(group.shares)})
    return out


def cost_per_million_tokens(cost_per_hour: float, output_tokens_per_s: float) -> float | None:
    """USD per million output tokens at the fleet's measured output rate."""
    return cost_per_hour / (output_tokens_per_s * 3600) * 1e6 if output_tokens_per_s > 0 else None


@dataclass(slots=True, kw_only=True)
class FleetSearchResult:
    space: FleetSpace
    capacities: list[Capacity]
    best: FleetRun | None
    planned: Fleet | None  # the MILP's fleet before any repair
    repairs: list[str]
    runner_ups: list[Fleet]
    homogeneous: dict[str, Fleet | None]  # cheapest fleet per GPU type (same planner, one type)
    cost_vs_rate: list[dict[str, Any]]
    reason: str
    wall_time_s: float
    seed: int = 0
    des_runs: int = 0
    extra_files: dict[str, str] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.best is not None and bool(self.best.metrics.get("slo_met"))

    def _candidate(self, fleet: Fleet, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
        tokens = metrics["output_tokens_per_s"] if metrics else None
        return {
            "label": fleet.label,
            "instances": [inst for g in fleet.groups for inst in _instances(self.space, g)],
            "gpus": fleet.gpus_by_type(),
            "cost_per_hour": fleet.cost_per_hour,
            "cost_per_million_tokens": cost_per_million_tokens(fleet.cost_per_hour, tokens) if tokens else None,
            "planned_rate_per_s": fleet.served_rate_per_s,
            "metrics": dict(metrics) if metrics else None,
        }

    def to_json(self) -> dict[str, Any]:
        best = self._candidate(self.best.fleet, self.best.metrics) if self.best else None
        candidates = ([best] if best else []) + [self._candidate(f, None) for f in self.runner_ups]
        return {
            "goal": "fleet", "objective": self.space.objective, "target_rate_per_s": self.space.target_rate_per_s,
            "candidates": candidates, "best": best, "evaluated": self.des_runs, "feasible": self.feasible,
            "wall_time_s": self.wall_time_s, "pruned": dict(self.space.pruned),
            "binding_constraint": self.reason if not self.feasible else self._binding(),
            "repairs": list(self.repairs),
            "capacities": [{"shape": c.shape.label, "bucket": list(self.space.buckets[c.bucket]),
                            "capacity_rate_per_s": c.rate_per_s, "probes": c.probes} for c in self.capacities],
            "homogeneous": {gpu: (f.cost_per_hour if f else None) for gpu, f in self.homogeneous.items()},
            "prices_per_hour": dict(self.space.prices_per_hour), "price_sources": dict(self.space.price_sources),
        }

    def _binding(self) -> str:
        fleet = self.planned or (self.best.fleet if self.best else None)
        if fleet is None:
            return ""
        for gpu, limit in self.space.availability.items():
            if fleet.gpus_by_type().get(gpu, 0) >= limit:
                return f"{gpu}_within_availability"
        if self.space.objective == "goodput":
            return "cost_within_budget"
        return "bucket_0_fully_served"

    def table(self) -> str:
        s = self.space
        lines = [f"fleet search: target {s.target_rate_per_s:g} req/s, SLO "
                 + ", ".join(f"{k} {v:g} s" for k, v in (("TTFT", s.slo.ttft_s), ("TPOT", s.slo.tpot_s), ("E2E", s.slo.e2e_s)) if v)
                 + f" at p{s.slo.percentile:g}; {len(s.shapes)} instance shapes on {len(s.prices_per_hour)} GPU types, "
                 f"{len(s.buckets)} size bucket(s)"]
        lines.append("capacities (req/s per instance, DES bisection):")
        for c in sorted(self.capacities, key=lambda c: (-c.rate_per_s, c.shape)):
            lo, hi = s.buckets[c.bucket]
            bucket = "" if len(s.buckets) == 1 else f" prompts {lo}-{hi}" if hi < 2**62 else f" prompts {lo}+"
            lines.append(f"  {c.shape.label:<48}{bucket:<16} {c.rate_per_s:8.3f}")
        if self.best is None:
            lines.append(f"NO FEASIBLE FLEET: {self.reason}")
            return "\n".join(lines)
        m = self.best.metrics
        verdict = "meets" if m["slo_met"] else "MISSES"
        lines.append(f"best fleet ({'cost' if s.objective == 'cost' else 'goodput within budget'}):")
        for group, gm in zip(self.best.fleet.groups, self.best.group_metrics):
            for inst in _instances(s, group):
                share = ", ".join(f"{x:.0%}" for x in group.shares)
                lines.append(f"  {inst['count']:>3} x {inst['gpu']:<14} tp {inst['serving']['tp']} {inst['serving']['scheduler']:<14}"
                             f" {inst['role']:<8} bucket shares {share}")
        cpm = cost_per_million_tokens(self.best.fleet.cost_per_hour, m["output_tokens_per_s"])
        lines.append(f"  cost ${self.best.fleet.cost_per_hour:.2f}/h, ${cpm:.3f} per million output tokens" if cpm else
                     f"  cost ${self.best.fleet.cost_per_hour:.2f}/h")
        shed = (f"; {m['shed_requests']} shed at the router (over budget), attainment of the admitted "
                f"{m['admitted_slo_attainment']:.1%}" if m["shed_requests"] else "")
        lines.append(f"  re-simulated at {s.target_rate_per_s:g} req/s ({m['num_requests']} requests): SLO attainment "
                     f"{m['slo_attainment']:.1%}{shed} ({verdict} p{s.slo.percentile:g}); goodput "
                     f"{m['goodput_requests_per_s']:.2f} req/s; TTFT p90 {(m['ttft_s'] or {}).get('p90', float('nan')):.3f} s, "
                     f"TPOT p90 {(m['tpot_s'] or {}).get('p90', float('nan')):.4f} s, {m['output_tokens_per_s']:.0f} output tok/s")
        for note in self.repairs:
            lines.append(f"  repair: {note}")
        lines.append("  vs one GPU type (same capacities): " + ", ".join(
            f"{gpu} ${f.cost_per_hour:.2f}/h" if f is not None and f.groups else f"{gpu} none within the caps"
            for gpu, f in self.homogeneous.items()))
        if self.runner_ups:
            lines.append("runner-ups (MILP, not re-simulated):")
            for f in self.runner_ups:
                desc = " + ".join(f"{'/'.join(map(str, g.counts))} x {g.option.label}" for g in f.groups)
                lines.append(f"  ${f.cost_per_hour:8.2f}/h  {f.label}: {desc}")
        lines.append(f"{self.des_runs} DES runs, {self.wall_time_s:.1f} s")
        return "\n".join(lines)

    def write_outputs(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        path = out_dir / "capacities.csv"
        with path.open("w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(["gpu", "tp", "scheduler", "role", "max_num_seqs", "chunk_size", "bucket_min_prompt",
                        "bucket_max_prompt", "capacity_rate_per_s", "probes"])
            for c in self.capacities:
                lo, hi = self.space.buckets[c.bucket]
                w.writerow([c.shape.gpu, c.shape.tp, c.shape.scheduler, c.shape.role, c.shape.max_num_seqs,
                            c.shape.chunk_size, lo, hi, f"{c.rate_per_s:.6g}", c.probes])
        written.append(path)
        path = out_dir / "fleets.csv"
        with path.open("w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(["label", "groups", "gpus", "cost_per_hour", "simulated_slo_attainment", "cost_per_million_tokens"])
            fleets = ([(self.best.fleet, self.best.metrics)] if self.best else []) + [(f, None) for f in self.runner_ups]
            for f, m in fleets:
                desc = " + ".join(f"{'/'.join(map(str, g.counts))} x {g.option.label}" for g in f.groups)
                cpm = cost_per_million_tokens(f.cost_per_hour, m["output_tokens_per_s"]) if m else None
                w.writerow([f.label, desc, json.dumps(f.gpus_by_type()), f"{f.cost_per_hour:.4f}",
                            f"{m['slo_attainment']:.4f}" if m else "", f"{cpm:.4f}" if cpm else ""])
        written.append(path)
        written.append(self._plot(out_dir / "cost_vs_rate.png"))
        if self.best is not None:
            written.extend(self._fleet_configs(out_dir))
        return written

    def _plot(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        series: dict[str, list[tuple[float, float]]] = {}
        for row in self.cost_vs_rate:
            for key, cost in row["costs"].items():
                if cost is not None:
                    series.setdefault(key, []).append((row["rate_per_s"], cost))
        for key, points in series.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=key, linewidth=2.5 if key == "all GPU types" else 1.2)
        if self.best is not None:
            ax.scatter([self.space.target_rate_per_s], [self.best.fleet.cost_per_hour], color="black", zorder=5,
                       label="chosen (re-simulated)")
        ax.set_xlabel("target rate (requests/s)")
        ax.set_ylabel("fleet cost (USD/hour)")
        ax.set_title("cheapest fleet meeting the SLO (MILP over measured capacities)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def _fleet_configs(self, out_dir: Path) -> list[Path]:
        """fleet.toml: the largest group as a config `llmsim simulate` runs as is. One group: the
        same [workload] at the target rate (the stream the planner re-simulated). Several groups:
        each gets its routed requests as a trace file (fleet-N.toml + fleet-N-trace.csv)."""
        assert self.best is not None
        run = self.best
        order = sorted(range(len(run.fleet.groups)), key=lambda i: -run.fleet.groups[i].gpus)
        written = []
        slo = {k: v for k, v in (("ttft_s", self.space.slo.ttft_s), ("tpot_s", self.space.slo.tpot_s),
                                 ("e2e_s", self.space.slo.e2e_s)) if v is not None}
        slo["percentile"] = self.space.slo.percentile
        for rank, i in enumerate(order):
            group = run.fleet.groups[i]
            name = "fleet.toml" if rank == 0 else f"fleet-{rank + 1}.toml"
            specs = run.group_specs[i]
            if len(run.fleet.groups) == 1:
                cfg = serving_config(self.space.config, group.option, group.counts, self.space.target_rate_per_s,
                                     self.space.fleet_requests, slo)
                cfg["workload"]["seed"] = self._seed()
            else:
                trace = out_dir / name.replace(".toml", "-trace.csv")
                with trace.open("w", newline="") as handle:
                    w = csv.writer(handle)
                    w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
                    for spec in specs:
                        w.writerow([repr(spec.arrival_s), spec.prompt_tokens, spec.output_tokens])
                written.append(trace)
                rate = self.space.target_rate_per_s * len(specs) / max(1, sum(len(p) for p in run.group_specs))
                cfg = serving_config(self.space.config, group.option, group.counts, rate, len(specs), slo)
                cfg["workload"] = {"arrival": "trace", "trace": trace.name, "num_requests": len(specs)}
            header = (f"# written by `llmsim search` (goal fleet): group {rank + 1} of {len(order)} of the chosen fleet, "
                      f"{'/'.join(map(str, group.counts))} x {group.option.label}\n")
            path = out_dir / name
            path.write_text(header + toml_dumps(cfg))
            written.append(path)
        return written

    def _seed(self) -> int:
        return self.seed


# ---- the search -----------------------------------------------------------------------------------------


def _median_lengths(config: Mapping[str, Any]) -> tuple[int, int]:
    """Median prompt and output tokens of the workload (2,000 draws, seed 0)."""
    workload = parse_workload(section(config, "workload"))
    sample = build_requests(replace(workload, rate_per_s=1.0, num_requests=2000), np.random.default_rng(0))
    return int(np.median([r.prompt_tokens for r in sample])), int(np.median([r.output_tokens for r in sample]))


def _step_cost(config: Mapping[str, Any], shape: Shape) -> StepCostModel:
    """The step-cost model of one instance of ``shape`` (the one the serving DES builds)."""
    model = resolve_model(config)
    spec = parse_serving(_serving_base(config))
    gpu = get_gpu(shape.gpu)
    node = get_node(gpu.default_node)
    cluster = build_cluster(gpu, node, get_network(node.default_network), shape.tp)
    return StepCostModel(
        ReplicaShape(model=model, cluster=cluster, tp=shape.tp, weight_precision=spec.weight_precision,
                     kv_precision=spec.kv_precision, activation_precision=spec.activation_precision),
        step_overhead_s=spec.step_overhead_s, request_overhead_s=spec.request_overhead_s,
    )


def start_rate_per_s(config: Mapping[str, Any], shape: Shape) -> float:
    """Where the capacity bisection starts: half the request rate of static batches of
    min(max_num_seqs, STARTING_BATCH) median requests back to back (cost model only), a power of 2
    so that nearby shapes share probe rates."""
    prompt, output = _median_lengths(config)
    batch = min(shape.max_num_seqs, STARTING_BATCH)
    times = static_batch_times(_step_cost(config, shape), batch=batch, input_tokens=prompt, output_tokens=output)
    rate = batch / times.total_s / 2
    return float(2.0 ** round(math.log2(min(max(rate, MIN_RATE_PER_S), MAX_RATE_PER_S))))


def unservable_reason(space: FleetSpace) -> str:
    """Why no instance can meet the SLO, from the cost model: the median prompt's prefill alone
    against the TTFT limit and one decode step against the TPOT limit, on the fastest shape."""
    config = space.config
    median_prompt, median_output = _median_lengths(config)
    best_prefill: tuple[float, str] | None = None
    best_decode: tuple[float, str] | None = None
    for shape in space.shapes:
        cost = _step_cost(config, shape)
        prefill = cost.batch_time_s(median_prompt, [(median_prompt, median_prompt)], 1)
        decode = cost.batch_time_s(1, [(1, median_prompt + median_output)], 1)
        if best_prefill is None or prefill < best_prefill[0]:
            best_prefill = (prefill, f"{shape.gpu} tp {shape.tp}")
        if best_decode is None or decode < best_decode[0]:
            best_decode = (decode, f"{shape.gpu} tp {shape.tp}")
    if not space.shapes:
        return f"no instance shape fits in memory ({', '.join(f'{k}: {v}' for k, v in space.pruned.items())})"
    assert best_prefill is not None and best_decode is not None
    if space.slo.ttft_s is not None and best_prefill[0] > space.slo.ttft_s:
        return (f"slo.ttft_s = {space.slo.ttft_s:g} s is below the prefill time of the median prompt "
                f"({median_prompt} tokens) on the fastest instance ({best_prefill[1]}): {best_prefill[0]:.3f} s")
    if space.slo.tpot_s is not None and best_decode[0] > space.slo.tpot_s:
        return (f"slo.tpot_s = {space.slo.tpot_s:g} s is below one decode step of a single request on the fastest "
                f"instance ({best_decode[1]}): {best_decode[0]:.4f} s")
    return f"no instance shape meets the SLO even at {MIN_RATE_PER_S:g} req/s"


def _no_fleet(space: FleetSpace, capacities: list[Capacity], reason: str, start: float, runs: int) -> FleetSearchResult:
    return FleetSearchResult(space=space, capacities=capacities, best=None, planned=None, repairs=[], runner_ups=[],
                             homogeneous={}, cost_vs_rate=[], reason=reason, wall_time_s=time.perf_counter() - start,
                             des_runs=runs)


def search_fleet(config: Mapping[str, Any], options: SearchOptions) -> FleetSearchResult:
    start = time.perf_counter()  # reported wall time only
    space = parse_fleet(config, options)
    if not space.shapes:
        return _no_fleet(space, [], unservable_reason(space), start, 0)
    reason = unservable_reason(space)
    if reason.startswith("slo."):  # the cost model already proves no instance can meet it
        return _no_fleet(space, [], reason, start, 0)
    task_config = _task_config(space, options)
    tasks = [(task_config, shape, b) for shape in space.shapes for b in range(len(space.buckets))]
    workers = max(1, options.workers)
    chunk = max(1, math.ceil(len(tasks) / (workers * 4)))
    work = [tasks[i:i + chunk] for i in range(0, len(tasks), chunk)]
    with progress(len(tasks), "capacities") as update:
        results = map_batches(_capacity_batch, work, workers=workers, dask_address=options.dask_address, on_done=update)
    capacities = [c for batch in results for c in batch]
    runs = sum(c.probes for c in capacities)
    table = {(c.shape, c.bucket): c.rate_per_s for c in capacities}
    planned = solve_fleet(space, table, space.target_rate_per_s)
    if planned is None or not planned.groups:
        why = reason if all(c.rate_per_s == 0 for c in capacities) else (
            "no fleet within " + ", ".join(f"{g} <= {n} GPUs" for g, n in space.availability.items())
            + (f" and ${space.budget_per_hour:g}/h" if space.budget_per_hour else "") + " covers the target rate")
        return _no_fleet(space, capacities, why, start, runs)
    seed = options.seed
    run = simulate_fleet(space, planned, seed)
    runs += len(planned.groups)
    repairs: list[str] = []
    while not run.metrics["slo_met"] and len(repairs) < space.max_repairs:
        m = run.metrics
        before = (f"attainment {m['slo_attainment']:.1%}, " + ("the queue grows (saturated)" if m["saturated"]
                  else f"below p{space.slo.percentile:g}"))
        derated = _derate(space, run, table)
        fleet = solve_fleet(space, table, space.target_rate_per_s)
        if fleet is None or not fleet.groups:
            repairs.append(f"{before}; with {derated} at {REPAIR_DERATE:.0%} capacity no fleet fits the caps")
            break
        if _layout(fleet) == _layout(run.fleet):
            repairs.append(f"{before}: {derated} capacity x {REPAIR_DERATE:g}, the MILP keeps the same fleet")
            continue
        run = simulate_fleet(space, fleet, seed)
        runs += len(fleet.groups)
        desc = " + ".join(f"{'/'.join(map(str, g.counts))} x {g.option.label}" for g in fleet.groups)
        repairs.append(f"{before}: {derated} capacity x {REPAIR_DERATE:g}, re-planned {desc} "
                       f"(${fleet.cost_per_hour:.2f}/h): attainment {run.metrics['slo_attainment']:.1%}")
    homogeneous = {
        gpu: solve_fleet(space, table, space.target_rate_per_s, [o for o in space.options if o.gpu == gpu],
                         label=f"only {gpu}")
        for gpu in space.prices_per_hour
    }
    runner_ups = [f for f in homogeneous.values() if f is not None and f.groups]
    for scheduler in sorted({s.scheduler for s in space.shapes}):
        f = solve_fleet(space, table, space.target_rate_per_s,
                        [o for o in space.options if o.shapes[0].scheduler == scheduler], label=f"only {scheduler}")
        if f is not None and f.groups:
            runner_ups.append(f)
    seen = {tuple((g.option, g.counts) for g in planned.groups)}
    unique = []
    for f in sorted(runner_ups, key=lambda f: f.cost_per_hour):
        key = tuple((g.option, g.counts) for g in f.groups)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    curve = []
    for factor in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0):
        rate = space.target_rate_per_s * factor
        costs: dict[str, float | None] = {}
        overall = solve_fleet(space, table, rate)
        costs["all GPU types"] = overall.cost_per_hour if overall and overall.groups else None
        for gpu in space.prices_per_hour:
            f = solve_fleet(space, table, rate, [o for o in space.options if o.gpu == gpu])
            costs[f"only {gpu}"] = f.cost_per_hour if f and f.groups else None
        curve.append({"rate_per_s": rate, "costs": costs})
    return FleetSearchResult(
        space=space, capacities=capacities, best=run, planned=planned, repairs=repairs, runner_ups=unique[: space.top_k],
        homogeneous=homogeneous, cost_vs_rate=curve, reason="" if run.metrics["slo_met"] else
        f"the fleet still misses the SLO after {len(repairs)} repairs (attainment {run.metrics['slo_attainment']:.1%})",
        wall_time_s=time.perf_counter() - start, seed=seed, des_runs=runs,
    )
