"""The training planner's answer: ranked plans, the Pareto set with the reason each plan is on it,
the binding constraint, the funnel, and the files (candidates.csv, pareto.csv, pareto.png,
best.toml). Everything here is a pure function of the search's results in their fixed order, so
the JSON is the same byte for byte whatever executor computed them (``wall_time_s`` aside)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from hardware import units
from sim.toml_writer import dumps as dumps_toml
from search.training_space import Candidate, Context, PLAN_FIELDS, candidate_config

SECONDS_PER_HOUR = 3600.0
PARETO_SHOWN = 12  # Pareto plans printed in the table (all of them go to pareto.csv and the JSON)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One priced plan: its candidate, where it came from and its metrics (analytic; DES when re-ranked)."""

    index: int  # order of discovery (enumeration order, then MILP refinements): the final tie-break
    candidate: Candidate
    context: Context
    source: str  # "screened" | "milp: layers_per_stage" | "milp: recompute_layers"
    analytic: dict[str, Any]
    des: dict[str, Any] | None = None

    @property
    def metrics(self) -> dict[str, Any]:
        return self.des if self.des is not None else self.analytic

    @property
    def context_capacity(self) -> float:
        return self.context.capacity_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.context.capacity_bytes - self.metrics["peak_memory_bytes"]

    @property
    def cost_per_hour(self) -> float | None:
        price = self.context.price_per_gpu_hour_usd
        return None if price is None else price * self.context.num_gpus


def objective_value(plan: Plan, objective: str, train_tokens: float | None, metrics: dict[str, Any] | None = None) -> float:
    """Smaller is better: -tokens/s, seconds to train, or dollars to train."""
    m = metrics if metrics is not None else plan.metrics
    if objective == "throughput":
        return -m["tokens_per_s"]
    seconds = train_tokens / m["tokens_per_s"]
    if objective == "time_to_train":
        return seconds
    return seconds / SECONDS_PER_HOUR * plan.cost_per_hour


def plan_json(plan: Plan, train_tokens: float | None, reason: str = "") -> dict[str, Any]:
    """One training candidate of INTERFACE.md's search JSON."""
    c = plan.candidate
    config = candidate_config(plan.context, c)
    metrics = dict(plan.metrics)
    out: dict[str, Any] = {
        "parallel": config["parallel"],
        "training": {"micro_batch": c.micro_batch, "global_batch": c.global_batch},
        "gpu": plan.context.gpu,
        "num_gpus": plan.context.num_gpus,
        "source": plan.source,
        "fidelity": metrics.get("fidelity"),
        "metrics": metrics,
        "analytic_tokens_per_s": plan.analytic["tokens_per_s"],
        "memory_headroom_bytes": plan.headroom_bytes,
        "cost_per_hour": plan.cost_per_hour,
        "time_to_train_s": train_tokens / plan.metrics["tokens_per_s"] if train_tokens else None,
        "cost_to_train_usd": (
            train_tokens / plan.metrics["tokens_per_s"] / SECONDS_PER_HOUR * plan.cost_per_hour
            if train_tokens and plan.cost_per_hour is not None else None
        ),
        "reason": reason,
    }
    return out


def pareto_set(plans: Sequence[Plan]) -> list[tuple[Plan, str]]:
    """Plans no other plan beats in all of throughput (more), memory headroom (more) and cost per
    hour (less; GPUs when there are no prices), each with why it is there; fastest first."""
    if not plans:
        return []
    priced = all(p.cost_per_hour is not None for p in plans)

    def third(p: Plan) -> float:
        return p.cost_per_hour if priced else float(p.context.num_gpus)

    points = [(p.metrics["tokens_per_s"], p.headroom_bytes, third(p)) for p in plans]
    order = sorted(range(len(plans)), key=lambda i: (-points[i][0], -points[i][1], points[i][2], plans[i].index))
    front: list[int] = []
    for i in order:
        t, h, c = points[i]
        dominated = any(
            points[j][0] >= t and points[j][1] >= h and points[j][2] <= c and points[j] != points[i] for j in front
        ) or any(points[j] == points[i] for j in front)
        if not dominated:
            front.append(i)
    label = "cost per hour" if priced else "GPUs"
    best_t = max(points[i][0] for i in front)
    best_h = max(points[i][1] for i in front)
    best_c = min(points[i][2] for i in front)
    out = []
    for rank, i in enumerate(front):
        t, h, c = points[i]
        reasons = []
        if t == best_t:
            reasons.append("highest throughput")
        if h == best_h:
            reasons.append("most memory headroom")
        if c == best_c and len({points[j][2] for j in front}) > 1:
            reasons.append(f"lowest {label}")
        if not reasons:
            faster = front[:rank]
            most_headroom_faster = max(points[j][1] for j in faster)
            cheapest_faster = min(points[j][2] for j in faster)
            if h > most_headroom_faster:
                reasons.append(
                    f"{(best_t - t) / best_t:.1%} below the fastest for {(h - most_headroom_faster) / units.GiB:.2f} GiB "
                    "more headroom than any faster plan"
                )
            if c < cheapest_faster:
                what = f"${c:,.0f}/h" if priced else f"{c:.0f} GPUs"
                reasons.append(f"cheaper than any faster plan ({what})")
        out.append((plans[i], "; ".join(reasons)))
    return out


@dataclass(slots=True, kw_only=True)
class Funnel:
    enumerated: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    screened: int = 0
    fits_in_memory: int = 0
    meets_constraints: int = 0
    milp_solved: dict[str, int] = field(default_factory=dict)
    milp_infeasible: dict[str, int] = field(default_factory=dict)
    milp_improved: dict[str, int] = field(default_factory=dict)
    des_reranked: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "enumerated": self.enumerated, "pruned": dict(self.pruned), "screened": self.screened,
            "fits_in_memory": self.fits_in_memory, "meets_constraints": self.meets_constraints,
            "milp_solved": dict(self.milp_solved), "milp_infeasible": dict(self.milp_infeasible),
            "milp_improved": dict(self.milp_improved), "des_reranked": self.des_reranked,
        }


# the Candidate fields of a candidates.csv row after gpu and num_gpus: the batch sizes, then
# PLAN_FIELDS but the planner's layers_per_stage and recompute_layers (a slice of the tuple)
_CSV_CANDIDATE_FIELDS = slice(Candidate._fields.index("global_batch"), Candidate._fields.index(PLAN_FIELDS[-3]) + 1)
assert Candidate._fields[_CSV_CANDIDATE_FIELDS] == ("global_batch", "micro_batch", *PLAN_FIELDS[:-2])


@dataclass(slots=True, kw_only=True)
class ScreenRow:
    """One line of candidates.csv: a screened candidate with its metrics, or a pruned one with its rule
    (``count`` > 1: an aggregate of prunes done before any plan was built)."""

    candidate: Candidate | None
    context: Context | None
    rule: str
    count: int = 1
    metrics: tuple[Any, ...] | None = None
    violates: str = ""


class ScreenRows(Sequence[ScreenRow]):
    """candidates.csv's lines, each built when read: the aggregate prunes, then one per enumerated
    candidate in enumeration order (a search enumerates hundreds of thousands; most are never read)."""

    def __init__(self, *, aggregates: Sequence[ScreenRow], candidates: Sequence[Candidate], contexts: Sequence[Context],
                 rules: Sequence[str | None], metrics: Sequence[tuple[Any, ...] | None], violates: dict[int, str]) -> None:
        """``rules[i]``: candidate i's prune rule, None when screened (``metrics[i]`` its metrics,
        ``violates.get(i, "")`` the constraint it misses)."""
        self._aggregates, self._candidates, self._contexts = aggregates, candidates, contexts
        self._rules, self._metrics, self._violates = rules, metrics, violates

    def __len__(self) -> int:
        return len(self._aggregates) + len(self._candidates)

    def __getitem__(self, index: int) -> ScreenRow:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]  # type: ignore[return-value]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index < len(self._aggregates):
            return self._aggregates[index]
        i = index - len(self._aggregates)
        candidate, rule = self._candidates[i], self._rules[i]
        if rule is not None:
            return ScreenRow(candidate=candidate, context=self._contexts[candidate.context], rule=rule)
        return ScreenRow(candidate=candidate, context=self._contexts[candidate.context], rule="",
                         metrics=self._metrics[i], violates=self._violates.get(i, ""))

    def __iter__(self) -> Iterator[ScreenRow]:
        return (self[i] for i in range(len(self)))


@dataclass(slots=True, kw_only=True)
class TrainingSearchResult:
    """What ``search_training`` returns (the SearchResult protocol of ``search.run``)."""

    objective: str
    train_tokens: float | None
    ranked: list[Plan]  # the DES re-ranked top K, best first (feasible ones)
    pareto: list[tuple[Plan, str]]
    binding_constraint: str
    funnel: Funnel
    rows: Sequence[ScreenRow]
    screen_metric_names: tuple[str, ...]
    wall_time_s: float
    feasible: bool
    contexts: tuple[Context, ...]

    @property
    def best(self) -> Plan | None:
        return self.ranked[0] if self.ranked else None

    # ---- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "goal": "training",
            "objective": self.objective,
            "candidates": [plan_json(p, self.train_tokens, "re-ranked with the DES") for p in self.ranked],
            "best": plan_json(best, self.train_tokens, "best objective in the DES") if best else None,
            "pareto": [plan_json(p, self.train_tokens, reason) for p, reason in self.pareto],
            "evaluated": self.funnel.screened,
            "feasible": self.feasible,
            "wall_time_s": self.wall_time_s,
            "pruned": dict(self.funnel.pruned),
            "binding_constraint": self.binding_constraint,
            "funnel": self.funnel.to_json(),
        }

    # ---- table -----------------------------------------------------------------------------------
    def table(self) -> str:
        f = self.funnel
        contexts = ", ".join(f"{c.num_gpus} x {c.gpu}" for c in self.contexts)
        lines = [f"training plan search: objective {self.objective}; {contexts}", ""]
        if self.ranked:
            lines.append("top plans (DES re-ranked; analytic tokens/s in brackets)")
            lines.append(_header())
            lines += [_row(i + 1, p, self.train_tokens) for i, p in enumerate(self.ranked)]
            lines.append("")
            lines.append(f"pareto set (throughput, memory headroom, {'cost per hour' if self._priced() else 'GPUs'})")
            lines.append(_header())
            shown = self.pareto[:PARETO_SHOWN]
            lines += [_row(i + 1, p, self.train_tokens) + f"\n      why: {reason}" for i, (p, reason) in enumerate(shown)]
            if len(self.pareto) > len(shown):
                lines.append(f"  ... {len(self.pareto) - len(shown)} more in pareto.csv / the JSON")
            lines.append("")
        else:
            lines += ["no feasible plan", ""]
        lines.append(f"binding constraint: {self.binding_constraint}")
        lines.append("")
        lines.append("funnel")
        lines.append(f"  enumerated            {f.enumerated:>10,}")
        for rule, count in sorted(f.pruned.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  pruned {count:>14,}  {rule}")
        lines.append(f"  screened (analytic)   {f.screened:>10,}")
        lines.append(f"  fit in memory         {f.fits_in_memory:>10,}")
        lines.append(f"  meet the constraints  {f.meets_constraints:>10,}")
        for name in sorted(f.milp_solved):
            lines.append(
                f"  MILP {name:<17}{f.milp_solved[name]:>10,} solved, {f.milp_infeasible.get(name, 0)} infeasible, "
                f"{f.milp_improved.get(name, 0)} improved a plan"
            )
        lines.append(f"  re-ranked with DES    {f.des_reranked:>10,}")
        lines.append(f"  wall time             {self.wall_time_s:>10.1f} s")
        return "\n".join(lines)

    def _priced(self) -> bool:
        return all(c.price_per_gpu_hour_usd is not None for c in self.contexts)

    # ---- files -----------------------------------------------------------------------------------
    def write_outputs(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [self._write_candidates(out_dir / "candidates.csv"), self._write_pareto(out_dir / "pareto.csv")]
        if self.pareto:
            paths.append(self._plot(out_dir / "pareto.png"))
        if self.best is not None:
            path = out_dir / "best.toml"
            config = candidate_config(self.best.context, self.best.candidate)
            header = (
                f"# Best plan of `llmsim search` (objective {self.objective}): "
                f"{self.best.metrics['tokens_per_s']:,.0f} tokens/s in the DES, "
                f"{self.best.analytic['tokens_per_s']:,.0f} analytic. Run it with `llmsim simulate best.toml`.\n"
            )
            path.write_text(header + dumps_toml(config))
            paths.append(path)
        return paths

    def _write_candidates(self, path: Path) -> Path:
        fields = ["status", "rule", "count", "gpu", "num_gpus", "global_batch", "micro_batch", *PLAN_FIELDS[:-2],
                  *self.screen_metric_names, "violates"]
        no_plan = ("",) * (4 + len(PLAN_FIELDS) - 2)
        no_metrics = ("",) * len(self.screen_metric_names)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(fields)
            writer.writerows(
                (
                    "screened" if row.metrics is not None else "pruned", row.rule, row.count,
                    *(no_plan if row.candidate is None else (row.context.gpu, row.context.num_gpus,
                                                             *row.candidate[_CSV_CANDIDATE_FIELDS])),
                    *(no_metrics if row.metrics is None else row.metrics), row.violates,
                )
                for row in self.rows
            )
        return path

    def _write_pareto(self, path: Path) -> Path:
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["rank", "gpu", "num_gpus", "global_batch", "micro_batch", *PLAN_FIELDS, "source",
                             "fidelity", "tokens_per_s", "mfu", "peak_memory_bytes", "memory_headroom_bytes",
                             "cost_per_hour", "reason"])
            for rank, (p, reason) in enumerate(self.pareto, 1):
                c = p.candidate
                writer.writerow([
                    rank, p.context.gpu, p.context.num_gpus, c.global_batch, c.micro_batch,
                    *(list(v) if isinstance(v := getattr(c, name), tuple) else v for name in PLAN_FIELDS),
                    p.source, p.metrics["fidelity"], p.metrics["tokens_per_s"], p.metrics["mfu"],
                    p.metrics["peak_memory_bytes"], p.headroom_bytes, p.cost_per_hour, reason,
                ])
        return path

    def _plot(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        priced = self._priced()
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        xs = [p.headroom_bytes / units.GiB for p, _ in self.pareto]
        cs = [(p.cost_per_hour if priced else p.context.num_gpus) for p, _ in self.pareto]
        ys = [p.metrics["tokens_per_s"] for p, _ in self.pareto]
        best = self.best
        for axis, x, label in ((left, xs, "memory headroom (GiB)"), (right, cs, "cost ($/h)" if priced else "GPUs")):
            axis.scatter(x, ys, s=22, label="Pareto set")
            if best is not None:
                bx = best.headroom_bytes / units.GiB if axis is left else (best.cost_per_hour if priced else best.context.num_gpus)
                axis.scatter([bx], [best.metrics["tokens_per_s"]], marker="*", s=220, c="crimson", label="chosen plan")
            axis.set_xlabel(label)
            axis.set_ylabel("tokens/s")
            axis.grid(alpha=0.3)
        left.legend(loc="best")
        fig.suptitle(f"training plan search: Pareto set (objective {self.objective})")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _header() -> str:
    return (f"  # {'gpu':<14} {'gpus':>5} {'tp':>3} {'pp':>3} {'dp':>4} {'cp':>2} {'ep':>2} {'zero':>4} "
            f"{'sp':>2} {'schedule':<11} {'v':>2} {'mb':>3} {'recompute':<10} {'layers/stage':<16} {'tokens/s':>22} {'MFU':>6} "
            f"{'peak/cap GiB':>13} {'$/h':>7} {'train':>9}")


def _row(rank: int, p: Plan, train_tokens: float | None) -> str:
    c, m = p.candidate, p.metrics
    dp = p.context.num_gpus // (c.tp * c.pp * c.cp)
    recompute = c.recompute + (f"+{list(c.recompute_layers)}" if c.recompute_layers else "")
    split = ",".join(map(str, c.layers_per_stage)) if c.layers_per_stage else "even"
    if len(split) > 16:
        split = split[:13] + "..."
    cost = f"{p.cost_per_hour:7,.0f}" if p.cost_per_hour is not None else "      -"
    train = _duration(train_tokens / m["tokens_per_s"]) if train_tokens else "-"
    tokens = f"{m['tokens_per_s']:,.0f} ({p.analytic['tokens_per_s']:,.0f})" if p.des is not None else f"{m['tokens_per_s']:,.0f}"
    # experts folded apart from the attention: ep/etp; their all-to-alls hidden by the combined 1F1B: a "+"
    ep = (f"{c.ep}/{c.etp}" if c.etp else str(c.ep)) + ("+" if c.ep_comm_overlap else "")
    return (f"{rank:>3} {p.context.gpu:<14} {p.context.num_gpus:>5} {c.tp:>3} {c.pp:>3} {dp:>4} {c.cp:>2} {ep:>2} "
            f"{c.zero:>4} {'y' if c.sequence_parallel else 'n':>2} {c.schedule:<11} {c.virtual_stages:>2} {c.micro_batch:>3} {recompute:<10} {split:<16} "
            f"{tokens:>22} {m['mfu']:6.1%} {m['peak_memory_bytes'] / units.GiB:6.1f}/{p.context_capacity / units.GiB:<6.0f} "
            f"{cost} {train:>9}")


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    days = seconds / 86400
    return f"{days:.1f} d" if days >= 1 else f"{seconds / 3600:.1f} h"
