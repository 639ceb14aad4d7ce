"""The MILPs' numbers taken from the simulator itself, and their answers turned back into plans.

Seconds come from ``sim.training.costs.chunk_cost`` on probe chunks (one layer, with and without
the embedding / LM head, with and without full recompute), bytes from
``sim.training.memory.stage_memory_class`` with each stage's in-flight micro-batches: the same
pure functions the analytic fidelity and the DES price. Both are affine in the layer counts the
MILPs choose; where the simulator is not exactly affine (a working set is a max over layers) the
answer is re-priced by the analytic model before it is used.
"""

from __future__ import annotations

from sim.training.activations import inflight_microbatches
from sim.training.config import TrainingSetup
from sim.training.costs import chunk_cost, group_links
from sim.training.hetero import stage_setup
from sim.training.memory import memory_per_stage, stage_layer_kinds, stage_memory_class
from sim.training.pricing_cache import PricingCache
from search.training_milp import RecomputeInput, StageAssignmentInput
from workloads.plan import stage_layer_counts


class _Probe:
    """Prices chunks of one setup with one layer cache (stage ``stage``'s links: tensor- and context-
    parallel groups have the same shape on every stage; on a heterogeneous cluster, chunks of that
    stage's group, priced on its GPU)."""

    def __init__(self, setup: TrainingSetup, cache: PricingCache, stage: int = 0) -> None:
        self.setup, self.cache = stage_setup(setup, stage)[0], cache
        self.links = group_links(setup, stage, cache)
        self.layer_cache: dict = {}

    def seconds(self, layers: range, *, first: bool = False, last: bool = False, recomputed: int = 0) -> float:
        work = chunk_cost(
            self.setup, layers=layers, first=first, last=last, links=self.links, layer_cache=self.layer_cache,
            cache=self.cache, recomputed=recomputed,
        ).work
        return work.forward_s + work.backward_input_s + work.backward_weight_s

    def layer_s(self, layer: int, **kwargs: bool | int) -> float:
        return self.seconds(range(layer, layer + 1), **kwargs)


def _stage_bytes(setup: TrainingSetup, stage: int, dense: int, moe: int, recomputed: int = 0) -> float:
    model, plan, job = setup.model, setup.plan, setup.job
    kind = stage_memory_class(
        model, plan, job, dense_layers=dense, moe_layers=moe, first=stage == 0, last=stage == plan.pp - 1,
        recomputed_layers=recomputed, flash_attention=setup.fused_attention,
    )
    return kind.total_bytes(inflight_microbatches(plan, setup.num_microbatches, stage))


def stage_assignment_input(setup: TrainingSetup, capacity_bytes: float, cache: PricingCache) -> StageAssignmentInput:
    """(a)'s numbers for ``setup``'s plan shape (its split and recompute_layers are ignored)."""
    model, plan = setup.model, setup.plan
    layers = model.layers
    dense_layers = model.dense_layers if model.is_moe else layers
    dense_probe = 0 if dense_layers else None
    moe_probe = layers - 1 if dense_layers < layers else None
    probe = dense_probe if dense_probe is not None else moe_probe
    chunks = _Probe(setup, cache)
    dense_s = chunks.layer_s(dense_probe) if dense_probe is not None else 0.0
    moe_s = chunks.layer_s(moe_probe) if moe_probe is not None else 0.0
    first_s = chunks.layer_s(probe, first=True) - chunks.layer_s(probe)
    last_stage = (plan.pp * plan.virtual_stages - 1) % plan.pp
    ends = _Probe(setup, cache, last_stage) if setup.groups else chunks
    last_s = ends.layer_s(probe, last=True) - ends.layer_s(probe)
    per_stage: dict[str, tuple[float, ...]] = {}
    if setup.groups:  # a heterogeneous cluster: every stage's layers at its own group's speed and capacity
        probes = [_Probe(setup, cache, s) for s in range(plan.pp)]
        per_stage["dense_layer_s_per_stage"] = tuple(p.layer_s(dense_probe) if dense_probe is not None else 0.0 for p in probes)
        per_stage["moe_layer_s_per_stage"] = tuple(p.layer_s(moe_probe) if moe_probe is not None else 0.0 for p in probes)
        per_stage["capacity_bytes_per_stage"] = tuple(
            capacity_bytes * p.setup.cluster.gpu.hbm_capacity_bytes / setup.cluster.gpu.hbm_capacity_bytes for p in probes
        )
    static, dense_bytes, moe_bytes = [], [], []
    for s in range(plan.pp):
        one_d = _stage_bytes(setup, s, 1, 0) if dense_layers else None
        one_e = _stage_bytes(setup, s, 0, 1) if dense_layers < layers else None
        k_d = _stage_bytes(setup, s, 2, 0) - one_d if one_d is not None else 0.0
        k_e = _stage_bytes(setup, s, 0, 2) - one_e if one_e is not None else 0.0
        static.append(min(x for x in (one_d - k_d if one_d is not None else None,
                                      one_e - k_e if one_e is not None else None) if x is not None))
        dense_bytes.append(k_d)
        moe_bytes.append(k_e)
    return StageAssignmentInput(
        layers=layers, dense_layers=dense_layers, pp=plan.pp, virtual_stages=plan.virtual_stages,
        dense_layer_s=dense_s, moe_layer_s=moe_s, first_s=first_s, last_s=last_s, static_bytes=tuple(static),
        dense_layer_bytes=tuple(dense_bytes), moe_layer_bytes=tuple(moe_bytes), capacity_bytes=capacity_bytes,
        **per_stage,
    )


def recompute_input(setup: TrainingSetup, capacity_bytes: float, cache: PricingCache) -> RecomputeInput:
    """(b)'s numbers for ``setup`` as split (its recompute_layers are ignored)."""
    model, plan, job = setup.model, setup.plan, setup.job
    kinds = stage_layer_kinds(model, plan)
    counts = stage_layer_counts(model.layers, plan)
    stage_layers = tuple(d + e for d, e in kinds)
    exact = memory_per_stage(model, plan, job, capacity_bytes=capacity_bytes,
                             flash_attention=setup.fused_attention)
    stage_s, extra_s, saved, working = [], [], [], []
    start = 0
    starts = []
    for count in counts:
        starts.append(start)
        start += count
    probe = _Probe(setup, cache)
    for s, (dense, moe) in enumerate(kinds):
        stage_s.append(sum(
            probe.seconds(range(starts[c], starts[c] + counts[c]), first=c == 0, last=c == len(counts) - 1)
            for c in range(s, len(counts), plan.pp)
        ))
        layer = starts[s]  # the stage's first layer: the block method recomputes the first ones
        extra_s.append(probe.layer_s(layer, recomputed=1) - probe.layer_s(layer))
        m0 = _stage_bytes(setup, s, dense, moe, 0)
        if stage_layers[s] >= 2:
            m1, m2 = _stage_bytes(setup, s, dense, moe, 1), _stage_bytes(setup, s, dense, moe, 2)
            per_layer = m1 - m2
        else:
            m1 = _stage_bytes(setup, s, dense, moe, 1) if stage_layers[s] else m0
            per_layer = 0.0
        saved.append(per_layer)
        working.append(max(0.0, m1 - m0 + per_layer))
    return RecomputeInput(
        layers=stage_layers, stage_s=tuple(stage_s), stage_bytes=tuple(b.total_bytes for b in exact),
        recompute_layer_s=tuple(extra_s), saved_bytes_per_layer=tuple(saved), working_bytes=tuple(working),
        capacity_bytes=capacity_bytes, num_microbatches=setup.num_microbatches,
    )
