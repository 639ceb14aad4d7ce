"""The training planner's space: ``[search]`` parsed into contexts (GPU type x cluster size, with
prices) and axis values, the candidates enumerated in a fixed order, and each candidate turned
into the simulator's own objects (for screening) or into a config (for the DES and best.toml).

Validity has one home, the simulator's plan validation (``workloads.plan.ParallelPlan`` and
``sim.training.config.validate_plan``): a candidate is built and validated there, and the message
of the rule it breaks, with its numbers replaced by N, is the prune rule it is counted under.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from functools import lru_cache
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

from hardware.catalog import get_gpu
from hardware.errors import CatalogError
from sim.config import reject_unknown_keys, resolve_cluster, section
from sim.errors import ConfigError
from sim.training.config import TrainingSetup, parse_training, validate_plan
from sim.training.schedules import config_virtual_stages
from workloads.errors import InvalidPlanError
from workloads.plan import RECOMPUTE, SCHEDULES, ParallelPlan, TrainingJob

# [search] keys of the training goal besides the [parallel] axes below
GOAL_KEYS = (
    "goal", "objective", "top_k", "num_gpus", "gpus", "prices_per_hour", "train_tokens", "max_gpus",
    "budget_per_hour", "min_memory_headroom", "global_batch", "micro_batch",
)
# [parallel] keys the planner can search over (a list of values or "auto"); absent ones: "auto"
AUTO_AXES = ("tp", "pp", "cp", "ep", "zero", "schedule", "virtual_stages", "recompute")
# [parallel] keys searched only when [search] lists them; otherwise their [parallel] value (or default)
LISTED_AXES = ("sequence_parallel", "offload", "hsdp", "tp_comm_overlap", "cp_comm", "etp", "ep_comm_overlap")
AXES = AUTO_AXES + LISTED_AXES
TRAINING_SEARCH_KEYS = GOAL_KEYS + AXES  # every [search] key of goal = "training" (docs/configuration.md)
# what the planner decides itself (MILPs) or derives
DERIVED = ("dp", "layers_per_stage", "recompute_layers")
OBJECTIVES = ("throughput", "time_to_train", "cost")
ZERO_STAGES = (0, 1, 2, 3)
# context parallelism is searched by default only while every rank keeps at least this many tokens
# (Megatron-Core recommends it for long sequences); list [search] cp to search beyond
MIN_CP_TOKENS = 4096


class Candidate(NamedTuple):
    """One point of the space (plain values: cheap to pickle and to sort)."""

    context: int  # index into TrainingSpace.contexts
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    schedule: str
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    offload: str
    hsdp: bool
    tp_comm_overlap: bool
    cp_comm: str
    etp: int = 0
    ep_comm_overlap: bool = False
    layers_per_stage: tuple[int, ...] = ()
    recompute_layers: tuple[int, ...] = ()


PLAN_FIELDS = ("tp", "pp", "cp", "ep", "zero", "schedule", "virtual_stages", "recompute", "sequence_parallel",
               "offload", "hsdp", "tp_comm_overlap", "cp_comm", "etp", "ep_comm_overlap", "layers_per_stage",
               "recompute_layers")
_PLAN_START = Candidate._fields.index(PLAN_FIELDS[0])  # the plan fields close a candidate, in this order
assert Candidate._fields[_PLAN_START:] == PLAN_FIELDS


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """One GPU type at one cluster size, with the config it is simulated from."""

    gpu: str
    num_gpus: int
    price_per_gpu_hour_usd: float | None
    price_source: str | None
    capacity_bytes: float  # HBM of one GPU
    config: dict[str, Any]  # the user's config with this [cluster], no [search]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpace:
    contexts: tuple[Context, ...]
    axes: dict[str, tuple[Any, ...] | None]  # None: every valid value ("auto")
    global_batches: tuple[int, ...]
    micro_batches: tuple[int, ...] | None  # None: auto
    objective: str
    train_tokens: float | None
    max_gpus: int | None
    budget_per_hour: float | None
    min_memory_headroom: float  # fraction of HBM capacity left free
    top_k: int | None


def _list(search: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> tuple[Any, ...] | None:
    if key not in search or search[key] == "auto":
        return None
    value = search[key]
    values = value if isinstance(value, list) else [value]
    if not values or any(not isinstance(v, kind) or (kind is int and isinstance(v, bool)) for v in values):
        name = {int: "integers", str: "strings", bool: "true/false"}.get(kind, "values")
        raise ConfigError(f"[search] {key} = {value!r} must be \"auto\" or a list of {name}")
    if kind is int:  # degrees, sizes and batches count from 1; ZeRO stages are 0..3; etp 0 = as tp
        allowed = ZERO_STAGES if key == "zero" else None
        minimum = 0 if key == "etp" else 1
        bad = [v for v in values if (v not in allowed if allowed else v < minimum)]
        if bad:
            rule = f"in {', '.join(map(str, allowed))}" if allowed else f">= {minimum}"
            raise ConfigError(f"[search] {key} = {value!r}: {bad[0]} is not allowed; each value must be {rule}")
    return tuple(dict.fromkeys(values))  # first occurrence order, no duplicates


def _positive(search: Mapping[str, Any], key: str) -> float | None:
    value = search.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"[search] {key} = {value!r} must be a positive finite number")
    return float(value)


def parse_space(config: Mapping[str, Any]) -> TrainingSpace:
    """``[search]`` of a training search, checked key by key."""
    search = section(config, "search")
    for key in DERIVED:
        if key in search:
            raise ConfigError(f"[search] {key}: the planner chooses it; remove the key")
    reject_unknown_keys(search, "search", TRAINING_SEARCH_KEYS)
    objective = search.get("objective", "throughput")
    if objective not in OBJECTIVES:
        raise ConfigError(f"[search] objective = {objective!r} must be one of {', '.join(OBJECTIVES)}")
    train_tokens = _positive(search, "train_tokens")
    if objective in ("time_to_train", "cost") and train_tokens is None:
        raise ConfigError(f"[search] objective = '{objective}' needs train_tokens (tokens to train on)")
    top_k = search.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ConfigError(f"[search] top_k = {top_k!r} must be a positive integer")
    max_gpus = search.get("max_gpus")
    if max_gpus is not None and (not isinstance(max_gpus, int) or isinstance(max_gpus, bool) or max_gpus < 1):
        raise ConfigError(f"[search] max_gpus = {max_gpus!r} must be a positive integer")
    headroom = search.get("min_memory_headroom", 0.0)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ConfigError(f"[search] min_memory_headroom = {headroom!r} must be a fraction of capacity in [0, 1)")
    budget = _positive(search, "budget_per_hour")

    training = section(config, "training")
    global_batches = _list(search, "global_batch", int)
    if global_batches is None:
        if not isinstance(training.get("global_batch"), int):
            raise ConfigError("[training] needs 'global_batch' (or give [search] global_batch)")
        global_batches = (training["global_batch"],)
    axes = {key: _list(search, key, bool if key in ("sequence_parallel", "hsdp", "tp_comm_overlap", "ep_comm_overlap")
                       else str if key in ("schedule", "recompute", "offload", "cp_comm") else int)
            for key in AXES}
    contexts = _contexts(config, search, objective, budget)
    return TrainingSpace(
        contexts=contexts, axes=axes, global_batches=global_batches, micro_batches=_list(search, "micro_batch", int),
        objective=objective, train_tokens=train_tokens, max_gpus=max_gpus, budget_per_hour=budget,
        min_memory_headroom=float(headroom), top_k=top_k,
    )


def _contexts(config: Mapping[str, Any], search: Mapping[str, Any], objective: str, budget: float | None) -> tuple[Context, ...]:
    cluster = section(config, "cluster")
    gpus = _list(search, "gpus", str)
    for name in gpus or ():
        try:
            get_gpu(name)
        except CatalogError as exc:
            raise ConfigError(f"[search] gpus: {exc}") from None
    gpus = gpus or (str(cluster.get("gpu")),)
    sizes = _list(search, "num_gpus", int)
    if sizes is None:
        if not isinstance(cluster.get("num_gpus"), int):
            raise ConfigError("[cluster] needs 'num_gpus' (or give [search] num_gpus)")
        sizes = (cluster["num_gpus"],)
    prices = search.get("prices_per_hour", {})
    if not isinstance(prices, dict) or any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in prices.values()
    ):
        raise ConfigError(f"[search] prices_per_hour = {prices!r} must map GPU names to dollars per GPU-hour")
    for name in prices:
        if name not in gpus:
            raise ConfigError(f"[search] prices_per_hour has '{name}', which is not one of the GPUs searched ({', '.join(gpus)})")
    base = {k: copy.deepcopy(v) for k, v in config.items() if k != "search"}
    contexts = []
    for gpu in gpus:
        for num_gpus in sizes:
            table = dict(cluster, gpu=gpu, num_gpus=num_gpus)
            if gpu != cluster.get("gpu"):  # node and network of [cluster] belong to its GPU
                table.pop("node", None)
                table.pop("network", None)
            context_config = dict(base, cluster=table)
            spec = resolve_cluster(context_config).gpu
            if gpu in prices:
                price, source = float(prices[gpu]), "[search] prices_per_hour"
            else:
                price, source = spec.price_per_hour_usd, spec.price_source
            if price is None and (objective == "cost" or budget is not None):
                raise ConfigError(
                    f"[search] gpu '{gpu}' has no price in the catalog; objective '{objective}'"
                    f"{' and budget_per_hour' if budget is not None else ''} need one: "
                    f"give [search] prices_per_hour = {{ \"{gpu}\" = DOLLARS_PER_GPU_HOUR }}"
                )
            contexts.append(Context(gpu=gpu, num_gpus=num_gpus, price_per_gpu_hour_usd=price, price_source=source,
                                    capacity_bytes=spec.hbm_capacity_bytes, config=context_config))
    return tuple(contexts)


# ---- the simulator's objects for one context -----------------------------------------------------
def context_setup(context: Context) -> TrainingSetup:
    """The context's config parsed once with a trivially valid plan (tp = pp = cp = 1): model,
    cluster, job and the run-wide [parallel] settings every candidate shares."""
    config = copy.deepcopy(context.config)
    parallel = {k: v for k, v in section(config, "parallel", required=False).items()
                if k not in AXES + DERIVED + ("virtual_stages",)}
    config["parallel"] = dict(parallel, tp=1, pp=1, cp=1, dp="auto")
    # a batch the trivial plan divides (each candidate brings its own job)
    config["training"] = dict(section(config, "training"), global_batch=context.num_gpus, micro_batch=1)
    return parse_training(config)


def default_axes(space: TrainingSpace, base: TrainingSetup) -> dict[str, tuple[Any, ...]]:
    """The values each axis takes in one context: the listed ones, or every value the simulator
    can run ("auto"); validation later prunes the combinations it rejects."""
    model, cluster, plan = base.model, base.cluster, base.plan
    n = cluster.num_gpus
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    axes = space.axes
    auto: dict[str, tuple[Any, ...]] = {
        "tp": tuple(d for d in divisors if d <= cluster.domain_gpus),  # tensor parallel inside an NVLink domain
        "pp": tuple(d for d in divisors if d <= model.layers),
        "cp": tuple(d for d in divisors if d == 1 or base.job.seq_len // d >= MIN_CP_TOKENS),
        "ep": tuple(d for d in divisors if d == 1 or (model.is_moe and model.experts % d == 0)),
        "zero": ZERO_STAGES,
        "schedule": tuple(s for s in SCHEDULES if not s.startswith("file")),
        "virtual_stages": None,  # per pp: see virtual_stage_values
        "recompute": RECOMPUTE,
        "sequence_parallel": None,  # per tp: on whenever tp > 1 (Megatron's recommendation)
        "offload": (plan.offload,),
        "hsdp": (plan.hsdp,),
        "tp_comm_overlap": (plan.tp_comm_overlap,),
        "cp_comm": (plan.cp_comm,),
        "etp": (plan.etp,),
        "ep_comm_overlap": (plan.ep_comm_overlap,),
    }
    return {key: axes[key] if axes[key] is not None else auto[key] for key in AXES}


def virtual_stage_values(layers: int, pp: int, listed: tuple[int, ...] | None) -> tuple[int, ...]:
    """Chunks per GPU to try at ``pp``: the listed ones, else 1 and every v >= 2 splitting each
    stage's layers into equal chunks (Megatron's interleaving requirement)."""
    if listed is not None:
        return listed
    if pp == 1 or layers % pp:
        return (1,)
    per_stage = layers // pp
    return (1,) + tuple(v for v in range(2, per_stage + 1) if per_stage % v == 0)


def micro_batch_values(global_batch: int, dp: int, listed: tuple[int, ...] | None) -> tuple[int, ...]:
    """The listed micro-batches, else every one that splits the batch evenly over the dp replicas
    (all divisors of the global batch when dp does not divide it: validation then names the rule)."""
    if listed is not None:
        return listed
    per_replica = global_batch // dp if global_batch % dp == 0 else global_batch
    return tuple(d for d in range(1, per_replica + 1) if per_replica % d == 0)


@lru_cache(maxsize=None)
def takes_virtual_stages(schedule: str, virtual_stages: int) -> bool:
    """Whether the simulator's plan validation lets ``schedule`` run ``virtual_stages`` (V shapes
    exactly 2, hanayo 2 per wave, the one-chunk schedules 1)."""
    try:
        ParallelPlan(pp=2, schedule=schedule, virtual_stages=virtual_stages)
    except InvalidPlanError:
        return False
    return True


def enumerate_candidates(space: TrainingSpace, bases: Sequence[TrainingSetup]) -> tuple[list[Candidate], dict[str, int]]:
    """Every combination in a fixed order, and the counts of the arithmetic prunes done before
    building plans (``max_gpus``; tp x pp x cp not dividing the cluster, which dp = "auto" needs)."""
    out: list[Candidate] = []
    pruned: dict[str, int] = {}
    for index, (context, base) in enumerate(zip(space.contexts, bases)):
        values = default_axes(space, base)
        n = context.num_gpus
        # with "auto" virtual stages, each schedule gets the chunk counts it runs: one-chunk schedules
        # v = 1, V shapes v = 2, hanayo even v (listed values are all tried, and pruned by validation)
        listed_v = space.axes["virtual_stages"] is not None
        for gb in space.global_batches:
            for tp in values["tp"]:
                sps = values["sequence_parallel"] if space.axes["sequence_parallel"] is not None else (tp > 1,)
                for pp in values["pp"]:
                    vs = virtual_stage_values(base.model.layers, pp, space.axes["virtual_stages"])
                    schedules = [(s, v) for s in values["schedule"] for v in vs if listed_v or takes_virtual_stages(s, v)]
                    for cp in values["cp"]:
                        if space.max_gpus is not None and n > space.max_gpus:
                            rule = f"num_gpus must be <= [search] max_gpus = {space.max_gpus}"
                        elif n % (tp * pp * cp):
                            rule = "tp x pp x cp must divide num_gpus (dp = num_gpus / (tp x pp x cp))"
                        else:
                            rule = ""
                        mbs = micro_batch_values(gb, max(1, n // (tp * pp * cp)), space.micro_batches)
                        rest = (values["ep"], values["zero"], schedules, mbs, values["recompute"], sps, values["offload"],
                                values["hsdp"], values["tp_comm_overlap"], values["cp_comm"], values["etp"],
                                values["ep_comm_overlap"])
                        if rule:
                            pruned[rule] = pruned.get(rule, 0) + math.prod(map(len, rest))
                            continue
                        combinations = itertools.product(*rest)
                        for ep, zero, (schedule, v), mb, recompute, sp, offload, hsdp, overlap, cp_comm, etp, ep_overlap in combinations:
                            out.append(Candidate(
                                index, gb, mb, tp, pp, cp, ep, zero, schedule, v, recompute, sp, offload, hsdp,
                                overlap, cp_comm, etp, ep_overlap,
                            ))
    return out, pruned


_NUMBER = re.compile(r"(?<![\w.-])-?\d+(\.\d+)?(?![\w.])")


def rule_of(message: str, memo: dict[str, str] | None = None) -> str:
    """A validation message with its numbers replaced by N: the rule it states."""
    if memo is None:
        return _NUMBER.sub("N", message)
    rule = memo.get(message)
    if rule is None:
        rule = memo[message] = _NUMBER.sub("N", message)
    return rule


MAX_PLANS = 1 << 17  # plans a SetupBuilder keeps (then it forgets them: results never depend on it)


class SetupBuilder:
    """Builds candidates of one context as the simulator's setups, validated by the simulator's
    rules (``ParallelPlan`` and ``validate_plan`` raise InvalidPlanError with the rule broken).
    The context's plan and setup fields are read once; each candidate only sets its own."""

    def __init__(self, base: TrainingSetup) -> None:
        self.base = base
        self._plan = {f.name: getattr(base.plan, f.name) for f in dataclasses.fields(base.plan)}
        self._setup = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        self._jobs: dict[tuple[int, int], TrainingJob] = {}
        # plan fields of a candidate -> its ParallelPlan, or the (class, args) of the error its
        # construction raised: candidates differing only in their batch sizes share one plan
        self._plans: dict[tuple[Any, ...], ParallelPlan | tuple[type[InvalidPlanError], tuple[Any, ...]]] = {}

    def job(self, global_batch: int, micro_batch: int) -> TrainingJob:
        job = self._jobs.get((global_batch, micro_batch))
        if job is None:
            base = self.base.job
            job = self._jobs[(global_batch, micro_batch)] = dataclasses.replace(
                base, global_batch=global_batch, micro_batch=micro_batch)
        return job

    def plan(self, candidate: Candidate) -> ParallelPlan:
        """The candidate's ``ParallelPlan`` (its construction validates it: raises InvalidPlanError),
        built once per distinct plan (dp follows from tp, pp and cp in one context)."""
        key = candidate[_PLAN_START:]
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            values = dict(self._plan, dp=self.base.cluster.num_gpus // (candidate.tp * candidate.pp * candidate.cp))
            values.update(zip(PLAN_FIELDS, key))
            try:
                plan = self._plans[key] = type(self.base.plan)(**values)
            except InvalidPlanError as exc:
                self._plans[key] = (type(exc), exc.args)
                raise
        elif type(plan) is tuple:
            raise plan[0](*plan[1])
        return plan  # type: ignore[return-value]

    def validated(self, candidate: Candidate, *, check_program: bool = True) -> tuple[ParallelPlan, TrainingJob]:
        """The candidate's plan and job, validated (``check_program=False``: all but its pipeline
        program, the last rule, which the caller checks; ``sim.training.config.validate_plan``)."""
        base = self.base
        plan = self.plan(candidate)
        job = self.job(candidate.global_batch, candidate.micro_batch)
        validate_plan(base.model, base.cluster, job, plan, check_program=check_program)
        return plan, job

    def setup(self, plan: ParallelPlan, job: TrainingJob) -> TrainingSetup:
        """The context's setup with this plan and job (as ``validated`` returned them)."""
        return type(self.base)(**dict(self._setup, job=job, plan=plan))

    def __call__(self, candidate: Candidate, *, check_program: bool = True) -> TrainingSetup:
        """The candidate's setup, validated (``validated``)."""
        return self.setup(*self.validated(candidate, check_program=check_program))


def build_setup(base: TrainingSetup, candidate: Candidate) -> TrainingSetup:
    """``SetupBuilder(base)(candidate)`` for a single candidate."""
    return SetupBuilder(base)(candidate)


def candidate_config(context: Context, candidate: Candidate) -> dict[str, Any]:
    """A complete config ``llmsim simulate`` runs as is: the context's config with the candidate's
    [training] batch sizes and every [parallel] key the planner chose."""
    config = copy.deepcopy(context.config)
    config["training"] = dict(section(config, "training"), global_batch=candidate.global_batch,
                              micro_batch=candidate.micro_batch)
    parallel = {k: v for k, v in section(config, "parallel", required=False).items() if k not in AXES + DERIVED}
    dp = context.num_gpus // (candidate.tp * candidate.pp * candidate.cp)
    chosen: dict[str, Any] = {name: getattr(candidate, name) for name in PLAN_FIELDS}
    chosen["virtual_stages"] = config_virtual_stages(candidate.schedule, candidate.virtual_stages)  # chunks -> config
    chosen["layers_per_stage"] = list(candidate.layers_per_stage)
    chosen["recompute_layers"] = list(candidate.recompute_layers) if candidate.recompute_layers else 0
    if not candidate.etp:  # the experts split like the attention: nothing to write
        del chosen["etp"]
    if not candidate.ep_comm_overlap:
        del chosen["ep_comm_overlap"]
    config["parallel"] = dict(parallel, dp=dp, **chosen)
    return config
