"""``[search] goal = "offload"``: FlexGen's placement LP (Sheng et al., ICML 2023, Sec. 4.2) over the
fractions of weights, KV cache and activations on GPU, CPU and disk, inside an enumeration of GPU
batch size and number of GPU batches; the best policies are then run through the SimPy block schedule
(``sim.offload``) and both throughputs are reported.

Per layer and block (``num_gpu_batches`` GPU batches), the five resources work concurrently, so a
layer takes the longest of them (FlexGen's cost model):

    T_pre = max(ctog, gtoc, dtoc, ctod, comp) in the prompt pass, T_gen likewise per decode step,
    T = layers x (T_pre + (output_tokens - 1) x T_gen),  throughput = block size x output_tokens / T.

ctog (CPU -> GPU) carries the off-GPU weights, KV cache and hidden states, dtoc (disk -> CPU) the
disk-resident shares of the same, gtoc / ctod the stores of new KV and hidden states. For fixed batch
sizes every term is linear in the fractions, so minimising T is an LP (each max is an epigraph
variable). Memory: each tier holds its share of all three kinds (KV for the whole block at the final
length); the GPU also holds double buffers for what it streams and the activation workspace, and the
CPU double buffers for what it stages from disk (the schedule reads disk two items ahead).
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pulp

from sim.config import reject_unknown_keys, resolve_cluster, resolve_model, section
from sim.errors import ConfigError
from sim.offload import LayerTerms, OffloadJob, OffloadPolicy, OffloadRun, TierFractions, layer_terms, simulate_offload
from search.run import DEFAULT_TOP_K, SearchOptions
from search.solver import expression_value, solve_checked
from workloads.precision import BYTES_PER_ELEMENT

OFFLOAD_SEARCH_KEYS = (
    "goal", "top_k", "gpu_batch", "num_gpu_batches", "weight_precision", "kv_precision",
    "gpu_memory_utilization", "cpu_memory_utilization",
)
# FlexGen enumerates GPU batch sizes and searches the number of GPU batches; these are its ranges
# (benchmark/flexgen/bench_suite.py uses gpu batches 1..64 and 1..16 GPU batches).
DEFAULT_GPU_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_NUM_GPU_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# Shares of device / host memory the placement may fill (vLLM's default gpu_memory_utilization; the
# rest is the CUDA context, allocator fragmentation and the OS). FlexGen's T4 setup budgets 15 of 16 GB
# and 204 of 208 GB.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_CPU_MEMORY_UTILIZATION = 0.9
TIE_BREAK_S_PER_BYTE = 1e-15
DEFAULT_SIMULATED = 1  # policies run through the SimPy schedule (--top / [search] top_k)
SHOWN = 5  # policies listed in the table and the JSON candidates
TERM_NAMES = {  # LP term -> the resource of sim.offload it models
    "comp": "compute", "ctog": "cpu_to_gpu", "gtoc": "gpu_to_cpu", "dtoc": "disk_to_cpu", "ctod": "cpu_to_disk",
    "hidden": "hidden_round_trip",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSpace:
    job: OffloadJob
    gpu_batches: tuple[int, ...]
    num_gpu_batches: tuple[int, ...]
    gpu_memory_bytes: float
    cpu_memory_bytes: float
    disk_bytes: float
    top_k: int


def _int_list(table: Mapping[str, Any], key: str, default: Sequence[int]) -> tuple[int, ...]:
    value = table.get(key, list(default))
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ConfigError(f"search.{key} = {value!r} must be a positive integer or a list of them")
    return tuple(sorted(set(value)))


def _fraction(table: Mapping[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"search.{key} = {value!r} must be a number in (0, 1]")
    return float(value)


def parse_offload(config: Mapping[str, Any], options: SearchOptions) -> OffloadSpace:
    """The job and the space of ``[search] goal = "offload"``; errors name the field."""
    table = section(config, "search")
    reject_unknown_keys(table, "search", OFFLOAD_SEARCH_KEYS)
    model = resolve_model(config)
    cluster = resolve_cluster(config, default_num_gpus=1)
    if cluster.num_gpus != 1:
        raise ConfigError(f"[cluster] num_gpus = {cluster.num_gpus}: the offload planner places one GPU's job (allowed: 1)")
    workload = section(config, "workload")
    reject_unknown_keys(workload, "workload", ("prompt_tokens", "output_tokens"))
    lengths = {}
    for key in ("prompt_tokens", "output_tokens"):
        value = workload.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"workload.{key} = {value!r} must be a positive integer (offload runs fixed-length batches)")
        lengths[key] = value
    if lengths["prompt_tokens"] + lengths["output_tokens"] > model.max_seq_len:
        raise ConfigError(
            f"workload.prompt_tokens + output_tokens = {lengths['prompt_tokens'] + lengths['output_tokens']} "
            f"exceeds {model.name}'s max_seq_len {model.max_seq_len}"
        )
    activation = "bf16" if "bf16" in cluster.gpu.peak_flops_per_s else "fp16"
    precisions = {}
    for key in ("weight_precision", "kv_precision"):
        value = table.get(key, activation)
        allowed = ("fp16", "bf16", "fp8", "int8", "int4")
        if value not in allowed or value not in BYTES_PER_ELEMENT:
            raise ConfigError(f"search.{key} = {value!r}; allowed: {', '.join(allowed)}")
        precisions[key] = value
    job = OffloadJob(model=model, cluster=cluster, activation_precision=activation, **lengths, **precisions)
    node = cluster.node
    top_k = options.top_k or table.get("top_k", DEFAULT_SIMULATED)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"search.top_k = {top_k!r} must be a positive integer")
    return OffloadSpace(
        job=job,
        gpu_batches=_int_list(table, "gpu_batch", DEFAULT_GPU_BATCHES),
        num_gpu_batches=_int_list(table, "num_gpu_batches", DEFAULT_NUM_GPU_BATCHES),
        gpu_memory_bytes=cluster.gpu.hbm_capacity_bytes * _fraction(table, "gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION),
        cpu_memory_bytes=node.cpu_dram_capacity_bytes * _fraction(table, "cpu_memory_utilization", DEFAULT_CPU_MEMORY_UTILIZATION),
        disk_bytes=node.nvme_capacity_bytes,
        top_k=min(top_k, DEFAULT_TOP_K),
    )


# ---- the LP --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """One solved LP: the policy, its predicted block time and which term binds each phase."""

    policy: OffloadPolicy
    block_s: float
    prefill_layer_s: float
    decode_layer_s: float
    prefill_terms_s: dict[str, float]
    decode_terms_s: dict[str, float]
    memory_bytes: dict[str, float]
    output_tokens: int  # per sequence

    @property
    def output_tokens_per_s(self) -> float:
        return self.policy.block_size * self.output_tokens / self.block_s

    @property
    def bottleneck(self) -> str:
        """The resource that binds the decode steps (they dominate every OPT case on the T4)."""
        return TERM_NAMES[max(self.decode_terms_s, key=lambda k: self.decode_terms_s[k])]


def placement_lp(
    terms: LayerTerms, num_gpu_batches: int, space: OffloadSpace
) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable], dict[str, dict[str, pulp.LpAffineExpression]], dict[str, pulp.LpAffineExpression]]:
    """The LP for one (gpu_batch, num_gpu_batches): variables, the five terms per phase, memory per tier."""
    nb = num_gpu_batches
    L, n = terms.layers, terms.output_tokens
    problem = pulp.LpProblem(f"offload_b{terms.gpu_batch}_n{nb}", pulp.LpMinimize)
    x = {
        f"{kind}_{tier}": problem.add_variable(f"{kind}_{tier}", lowBound=0, upBound=1)
        for kind in ("w", "c", "h") for tier in ("gpu", "cpu", "disk")
    }
    t_pre = problem.add_variable("t_prefill_layer_s", lowBound=0)
    t_gen = problem.add_variable("t_decode_layer_s", lowBound=0)
    # Ties (a resource with slack can take more bytes at no cost) go to the faster tier: a penalty of
    # TIE_BREAK_S_PER_BYTE per byte placed on CPU, twice that on disk (1e-4 s for 100 GB, far below
    # any block time), so the LP does not park data on disk when CPU memory would do.
    placed = {kind: total for kind, total in (("w", terms.weights_bytes * L),
                                              ("c", nb * terms.full_kv_bytes * L), ("h", nb * terms.prefill_hidden_bytes))}
    problem += L * t_pre + L * (n - 1) * t_gen + TIE_BREAK_S_PER_BYTE * pulp.lpSum(
        placed[k] * (x[f"{k}_cpu"] + 2 * x[f"{k}_disk"]) for k in "wch"
    )
    for kind in ("w", "c", "h"):
        problem += (x[f"{kind}_gpu"] + x[f"{kind}_cpu"] + x[f"{kind}_disk"] == 1, f"{kind}_fractions_sum_to_one")
    off = {kind: x[f"{kind}_cpu"] + x[f"{kind}_disk"] for kind in "wch"}
    disk = {kind: x[f"{kind}_disk"] for kind in "wch"}
    W = terms.weights_bytes
    phases = {
        "prefill": (terms.prefill_compute_s, 0.0, terms.prefill_kv_bytes, terms.prefill_hidden_bytes, t_pre),
        "decode": (terms.mean_decode_compute_s, terms.mean_decode_kv_bytes, terms.new_kv_bytes, terms.decode_hidden_bytes, t_gen),
    }
    exprs: dict[str, dict[str, pulp.LpAffineExpression]] = {}
    for phase, (comp_s, kv_read, kv_write, hidden, t) in phases.items():
        e = {
            "comp": pulp.LpAffineExpression(constant=nb * comp_s),
            "ctog": (W * off["w"] + nb * kv_read * off["c"] + nb * hidden * off["h"]) / terms.cpu_to_gpu_Bps,
            "gtoc": (nb * kv_write * off["c"] + nb * hidden * off["h"]) / terms.gpu_to_cpu_Bps,
            "dtoc": (W * disk["w"] + nb * kv_read * disk["c"] + nb * hidden * disk["h"]) / terms.disk_read_Bps,
            "ctod": (nb * kv_write * disk["c"] + nb * hidden * disk["h"]) / terms.disk_write_Bps,
        }
        # A GPU batch's hidden state leaves the GPU after layer l - 1 and must be back for layer l,
        # one layer period later: the period holds that batch's compute plus the round trip.
        e["hidden"] = comp_s + hidden * (off["h"] / terms.gpu_to_cpu_Bps + off["h"] / terms.cpu_to_gpu_Bps
                                         + disk["h"] / terms.disk_write_Bps + disk["h"] / terms.disk_read_Bps)
        for name, expr in e.items():
            problem += (t >= expr, f"{phase}_{name}_within_layer_time")
        exprs[phase] = e
    weights_total = W * L
    kv_total = nb * terms.full_kv_bytes * L
    hidden_total = nb * terms.prefill_hidden_bytes
    memory = {
        "gpu": weights_total * x["w_gpu"] + kv_total * x["c_gpu"] + hidden_total * x["h_gpu"]
        + 2 * W * off["w"] + 2 * terms.full_kv_bytes * off["c"] + 2 * terms.prefill_hidden_bytes * off["h"]
        + terms.workspace_bytes,
        "cpu": weights_total * x["w_cpu"] + kv_total * x["c_cpu"] + hidden_total * x["h_cpu"]
        + 2 * (W * disk["w"] + terms.full_kv_bytes * disk["c"] + terms.prefill_hidden_bytes * disk["h"]),
        "disk": weights_total * x["w_disk"] + kv_total * x["c_disk"] + hidden_total * x["h_disk"],
    }
    capacity = {"gpu": space.gpu_memory_bytes, "cpu": space.cpu_memory_bytes, "disk": space.disk_bytes}
    for tier, expr in memory.items():
        problem += (expr <= capacity[tier], f"{tier}_memory_within_capacity")
    return problem, x, exprs, memory


def solve_placement(terms: LayerTerms, num_gpu_batches: int, space: OffloadSpace) -> Placement | None:
    """The LP's optimum for one (gpu_batch, num_gpu_batches), verified in plain Python; None if infeasible."""
    problem, x, exprs, memory = placement_lp(terms, num_gpu_batches, space)
    solution = solve_checked(problem, tolerance=1e-5)
    if solution is None:
        return None
    v = solution.values

    def fractions(kind: str) -> TierFractions:
        raw = [min(max(v[f"{kind}_{tier}"], 0.0), 1.0) for tier in ("gpu", "cpu", "disk")]
        total = sum(raw)
        return TierFractions(gpu=raw[0] / total, cpu=raw[1] / total, disk=raw[2] / total)

    policy = OffloadPolicy(
        gpu_batch=terms.gpu_batch, num_gpu_batches=num_gpu_batches,
        weights=fractions("w"), kv_cache=fractions("c"), activations=fractions("h"),
    )
    pre = {k: expression_value(e, solution) for k, e in exprs["prefill"].items()}
    gen = {k: expression_value(e, solution) for k, e in exprs["decode"].items()}
    t_pre, t_gen = v["t_prefill_layer_s"], v["t_decode_layer_s"]
    return Placement(
        policy=policy, block_s=terms.layers * (t_pre + (terms.output_tokens - 1) * t_gen),
        prefill_layer_s=t_pre, decode_layer_s=t_gen, prefill_terms_s=pre, decode_terms_s=gen,
        memory_bytes={tier: expression_value(e, solution) for tier, e in memory.items()}, output_tokens=terms.output_tokens,
    )


# ---- the search ------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class OffloadSearchResult:
    space: OffloadSpace
    placements: list[Placement]  # every feasible LP optimum, best first
    runs: list[OffloadRun]  # SimPy runs of the first len(runs) placements
    evaluated: int
    wall_time_s: float
    pruned: dict[str, int] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return bool(self.placements)

    def _candidate(self, index: int) -> dict[str, Any]:
        p = self.placements[index]
        metrics: dict[str, Any] = {
            "output_tokens_per_s": p.output_tokens_per_s, "lp_output_tokens_per_s": p.output_tokens_per_s,
            "block_size": p.policy.block_size, "block_time_s": p.block_s,
            "prefill_layer_s": p.prefill_layer_s, "decode_layer_s": p.decode_layer_s,
            "prefill_terms_s": p.prefill_terms_s, "decode_terms_s": p.decode_terms_s,
            "bottleneck": p.bottleneck, "memory_bytes": p.memory_bytes,
        }
        if index < len(self.runs):
            run = self.runs[index]
            metrics.update(
                output_tokens_per_s=run.output_tokens_per_s,
                simulated_output_tokens_per_s=run.output_tokens_per_s,
                simulated_block_time_s=run.total_s, simulated_prefill_s=run.prefill_s,
                simulated_busy_s=run.busy_s, simulated_bottleneck=run.bottleneck,
                lp_vs_simulation_error=p.output_tokens_per_s / run.output_tokens_per_s - 1.0,
            )
        return {
            "policy": {"weights": p.policy.weights.as_dict(), "kv_cache": p.policy.kv_cache.as_dict(),
                       "activations": p.policy.activations.as_dict()},
            "gpu_batch": p.policy.gpu_batch, "num_gpu_batches": p.policy.num_gpu_batches, "metrics": metrics,
        }

    def to_json(self) -> dict[str, Any]:
        shown = min(len(self.placements), max(SHOWN, len(self.runs)))
        candidates = [self._candidate(i) for i in range(shown)]
        job = self.space.job
        return {
            "goal": "offload",
            "model": job.model.name, "gpu": job.cluster.gpu.name, "node": job.cluster.node.name,
            "prompt_tokens": job.prompt_tokens, "output_tokens": job.output_tokens,
            "weight_precision": job.weight_precision, "kv_precision": job.kv_precision,
            "candidates": candidates, "best": candidates[0] if candidates else None,
            "evaluated": self.evaluated, "feasible": self.feasible, "wall_time_s": self.wall_time_s,
            "pruned": dict(self.pruned),
            "binding_constraint": self.placements[0].bottleneck if self.placements else "gpu_memory_within_capacity",
        }

    def table(self) -> str:
        job = self.space.job
        head = (f"offload placement: {job.model.name} on {job.cluster.node.name} ({job.cluster.gpu.name}), "
                f"prompt {job.prompt_tokens}, output {job.output_tokens}, weights {job.weight_precision}, "
                f"KV {job.kv_precision}")
        if not self.placements:
            return (f"{head}\nno feasible placement: even gpu_batch {self.space.gpu_batches[0]} x "
                    f"{self.space.num_gpu_batches[0]} does not fit GPU + CPU + disk memory")
        lines = [head, f"{'#':>2} {'batch':>11} {'weights g/c/d %':>16} {'KV g/c/d %':>16} {'act g/c/d %':>16} "
                       f"{'LP tok/s':>9} {'sim tok/s':>9} {'diff':>6}  bottleneck"]

        def pct(f: TierFractions) -> str:
            return "/".join(f"{abs(getattr(f, tier)) * 100:.0f}" for tier in ("gpu", "cpu", "disk"))

        for i in range(min(len(self.placements), max(SHOWN, len(self.runs)))):
            p = self.placements[i]
            run = self.runs[i] if i < len(self.runs) else None
            sim = f"{run.output_tokens_per_s:9.3g}" if run else f"{'':>9}"
            diff = f"{(p.output_tokens_per_s / run.output_tokens_per_s - 1) * 100:+5.1f}%" if run else ""
            lines.append(
                f"{i + 1:>2} {p.policy.gpu_batch:>4} x {p.policy.num_gpu_batches:<4} {pct(p.policy.weights):>16} "
                f"{pct(p.policy.kv_cache):>16} {pct(p.policy.activations):>16} {p.output_tokens_per_s:9.3g} {sim} "
                f"{diff:>6}  {p.bottleneck}"
            )
        best = self.placements[0]
        lines.append(
            f"best: block of {best.policy.block_size} sequences ({best.policy.gpu_batch} x "
            f"{best.policy.num_gpu_batches}); memory GPU {best.memory_bytes['gpu'] / 1e9:.1f} GB, CPU "
            f"{best.memory_bytes['cpu'] / 1e9:.1f} GB, disk {best.memory_bytes['disk'] / 1e9:.1f} GB; "
            f"decode bound by {best.bottleneck}"
        )
        lines.append(
            f"{self.evaluated} LPs solved, {self.pruned.get('memory_infeasible', 0)} infeasible, "
            f"{self.pruned.get('larger_than_an_infeasible_block', 0)} skipped; {len(self.runs)} simulated; "
            f"{self.wall_time_s:.2f} s"
        )
        return "\n".join(lines)

    def write_outputs(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "candidates.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["gpu_batch", "num_gpu_batches", "block_size"]
                            + [f"{k}_{t}" for k in ("weights", "kv_cache", "activations") for t in ("gpu", "cpu", "disk")]
                            + ["lp_output_tokens_per_s", "simulated_output_tokens_per_s", "bottleneck",
                               "gpu_memory_bytes", "cpu_memory_bytes", "disk_bytes"])
            for i, p in enumerate(self.placements):
                pol = p.policy
                sim = self.runs[i].output_tokens_per_s if i < len(self.runs) else ""
                writer.writerow([pol.gpu_batch, pol.num_gpu_batches, pol.block_size]
                                + [f"{getattr(getattr(pol, k), t):.6f}" for k in ("weights", "kv_cache", "activations")
                                   for t in ("gpu", "cpu", "disk")]
                                + [f"{p.output_tokens_per_s:.6g}", f"{sim:.6g}" if sim != "" else "", p.bottleneck,
                                   f"{p.memory_bytes['gpu']:.0f}", f"{p.memory_bytes['cpu']:.0f}", f"{p.memory_bytes['disk']:.0f}"])
        best = out_dir / "offload.json"
        best.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return [path, best]


def search_offload(config: Mapping[str, Any], options: SearchOptions) -> OffloadSearchResult:
    """Solve the placement LP for every (gpu_batch, num_gpu_batches), rank by LP throughput and run
    the best ``top_k`` through the SimPy block schedule."""
    start = time.perf_counter()  # reported wall time only; no model decision reads it
    space = parse_offload(config, options)
    placements: list[Placement] = []
    evaluated = 0
    pruned = {"memory_infeasible": 0, "larger_than_an_infeasible_block": 0}
    for gpu_batch in space.gpu_batches:
        terms = layer_terms(space.job, gpu_batch)
        for index, num in enumerate(space.num_gpu_batches):
            evaluated += 1
            placement = solve_placement(terms, num, space)
            if placement is None:
                pruned["memory_infeasible"] += 1
                # more GPU batches need more memory in every tier: the larger counts cannot fit either
                pruned["larger_than_an_infeasible_block"] += len(space.num_gpu_batches) - index - 1
                break
            placements.append(placement)
    placements.sort(key=lambda p: (-p.output_tokens_per_s, p.policy.block_size, p.policy.gpu_batch))
    runs = [simulate_offload(space.job, p.policy) for p in placements[: space.top_k]]
    return OffloadSearchResult(
        space=space, placements=placements, runs=runs, evaluated=evaluated,
        wall_time_s=time.perf_counter() - start, pruned={k: v for k, v in pruned.items() if v},
    )
