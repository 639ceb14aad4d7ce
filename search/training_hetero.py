"""``llmsim search`` on a heterogeneous cluster (``[cluster] groups``): the layer split of the given
plan, chosen by the stage-assignment MILP (``search.training_milp.assign_layers``) from every stage's
own layer seconds and capacity (``search.training_refine.stage_assignment_input``: each stage priced
on its group's GPU), then simulated beside the even split with the DES.

The full plan space (tp, pp, ... over groups) is not searched on such a cluster: the stage
placement (``[parallel] stage_groups``) ties pp and the per-stage GPU count to the groups, so the
plan is taken as given and only the split (``layers_per_stage``) is chosen.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from search.run import SearchOptions
from search.training_milp import MilpInfeasible, assign_layers
from search.training_refine import stage_assignment_input
from sim.config import reject_unknown_keys, section
from sim.errors import ConfigError
from sim.runner import RunOptions, simulate
from sim.training.config import parse_training
from sim.training.pricing_cache import PricingCache
from workloads.plan import stage_layer_counts

# [search] keys read on a heterogeneous cluster (the others choose plan axes, which it does not search)
HETERO_SEARCH_KEYS = ("goal", "objective", "min_memory_headroom", "top_k")


@dataclass(slots=True, kw_only=True)
class SplitCandidate:
    reason: str  # "even split" | "milp: layers_per_stage"
    config: dict[str, Any]
    metrics: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class HeteroSplitResult:
    """The SearchResult of ``search.run`` for a heterogeneous cluster's split."""

    candidates: list[SplitCandidate]  # best first
    milp_stage_s: tuple[float, ...]
    wall_time_s: float
    binding_constraint: str
    feasible: bool

    def _json(self, c: SplitCandidate) -> dict[str, Any]:
        return {"parallel": c.config["parallel"], "training": c.config["training"],
                "num_gpus": c.config["cluster"].get("num_gpus"), "metrics": c.metrics, "reason": c.reason}

    def to_json(self) -> dict[str, Any]:
        best = next((c for c in self.candidates if c.metrics["fits_in_memory"]), None)
        return {
            "goal": "training",
            "objective": "throughput",
            "candidates": [self._json(c) for c in self.candidates],
            "best": self._json(best) if best else None,
            "evaluated": len(self.candidates),
            "feasible": self.feasible,
            "wall_time_s": self.wall_time_s,
            "pruned": {},
            "binding_constraint": self.binding_constraint,
        }

    def table(self) -> str:
        lines = ["layer split on a heterogeneous cluster (the plan as given; the split from the stage-assignment MILP)",
                 "", f"{'split':<36} {'iteration s':>12} {'tokens/s':>12} {'MFU':>7}  fits  reason"]
        for c in self.candidates:
            m = c.metrics
            split = ",".join(map(str, c.config["parallel"]["layers_per_stage"])) or "even"
            lines.append(f"{split:<36} {m['iteration_time_s']:12.4f} {m['tokens_per_s']:12,.0f} {m['mfu']:7.1%}  "
                         f"{'yes' if m['fits_in_memory'] else 'NO':<4}  {c.reason}")
        if self.milp_stage_s:
            lines += ["", "MILP stage seconds per micro-batch (F + B + W): " + ", ".join(f"{s:.4f}" for s in self.milp_stage_s)]
        if not self.feasible:
            lines += ["", f"no split fits: {self.binding_constraint}"]
        lines.append(f"wall time {self.wall_time_s:.1f} s")
        return "\n".join(lines)

    def write_outputs(self, out_dir: Path) -> list[Path]:
        from sim.toml_writer import dumps as dumps_toml

        paths = [out_dir / "candidates.json"]
        paths[0].write_text(json.dumps([self._json(c) for c in self.candidates], indent=2, default=str) + "\n")
        best = next((c for c in self.candidates if c.metrics["fits_in_memory"]), None)
        if best is not None:
            paths.append(out_dir / "best.toml")
            paths[-1].write_text(dumps_toml(best.config))
        return paths


def search_hetero_split(config: Mapping[str, Any], options: SearchOptions) -> HeteroSplitResult:
    start = time.perf_counter()
    search = section(config, "search")
    reject_unknown_keys(search, "search", HETERO_SEARCH_KEYS)
    if search.get("objective", "throughput") != "throughput":
        raise ConfigError(f"[search] objective = {search['objective']!r}: on [cluster] groups the split search maximises throughput only")
    headroom = search.get("min_memory_headroom", 0.0)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ConfigError(f"[search] min_memory_headroom = {headroom!r} must be a fraction of capacity in [0, 1)")
    base = {k: copy.deepcopy(v) for k, v in config.items() if k != "search"}
    base.setdefault("parallel", {})["layers_per_stage"] = []
    setup = parse_training(base, options.config_dir)
    run_options = RunOptions(fidelity="des", config_dir=options.config_dir)
    candidates = [SplitCandidate(reason="even split", config=base, metrics=simulate(base, run_options).metrics())]
    stage_s: tuple[float, ...] = ()
    binding = ""
    if setup.plan.pp > 1:
        capacity = setup.cluster.gpu.hbm_capacity_bytes * (1.0 - float(headroom))
        try:
            answer = assign_layers(stage_assignment_input(setup, capacity, PricingCache()))
        except MilpInfeasible as exc:
            binding = str(exc)
        else:
            stage_s = answer.stage_s
            if answer.layers_per_chunk != stage_layer_counts(setup.model.layers, setup.plan):
                balanced = copy.deepcopy(base)
                balanced["parallel"]["layers_per_stage"] = list(answer.layers_per_chunk)
                candidates.append(SplitCandidate(reason="milp: layers_per_stage", config=balanced,
                                                 metrics=simulate(balanced, run_options).metrics()))
    candidates.sort(key=lambda c: (not c.metrics["fits_in_memory"], c.metrics["iteration_time_s"]))
    feasible = any(c.metrics["fits_in_memory"] for c in candidates)
    if not feasible and not binding:
        binding = "memory: no split fits every stage's GPU"
    return HeteroSplitResult(candidates=candidates, milp_stage_s=stage_s, wall_time_s=time.perf_counter() - start,
                             binding_constraint=binding, feasible=feasible)
