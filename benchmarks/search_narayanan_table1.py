"""The training planner against the plans of Narayanan et al. 2021 (arXiv 2104.04473) Table 1.

Covers: issue "Planner" acceptance: for each Table 1 setting (model, GPU count and global batch
fixed; tp, pp, micro-batch, schedule, virtual stages, recompute, ZeRO and sequence parallelism
free) the best plan's predicted throughput is at least that of the published plan under the same
model (the published plan simulated by the DES with the row's own config, as `llmsim validate`
runs it). Prints one line per row: published plan and its DES tokens/s, chosen plan and its DES
tokens/s, the gain and the search's wall time.

    python benchmarks/search_narayanan_table1.py [--rows narayanan-1.7b,narayanan-3.6b] [--workers N] [--features-2021]
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

from search.run import SearchOptions, run_search
from sim.runner import RunOptions
from sim.training.run import simulate_training
from validation.training_suite import published_rows, row_config

# axes left free; the published plan is one point of this space
FREE = {"sequence_parallel": [False, True]}
# --features-2021: only what Megatron-LM offered in 2021 (no ZeRO / distributed optimizer, no
# sequence parallelism); tp, pp, micro-batch, schedule, virtual stages and recompute stay free
FEATURES_2021 = {"sequence_parallel": [False], "zero": [0]}


def search_config(row: dict[str, str], top_k: int, free: dict[str, Any] = FREE) -> dict[str, Any]:
    config = row_config(row)
    search = copy.deepcopy(config)
    search.pop("parallel")
    search["training"].pop("micro_batch")
    search["search"] = {"goal": "training", "objective": "throughput", "top_k": top_k, **free}
    return search


def plan_text(parallel: dict[str, Any], micro_batch: int) -> str:
    v = parallel.get("virtual_stages", 1)
    text = (f"tp{parallel['tp']} pp{parallel['pp']} dp{parallel['dp']} mb{micro_batch} {parallel['schedule']}"
            f"{f' v{v}' if v > 1 else ''} {parallel['recompute']} zero{parallel['zero']}"
            f"{' sp' if parallel['sequence_parallel'] else ''}")
    if parallel.get("recompute_layers"):
        text += f" recompute_layers {parallel['recompute_layers']}"
    if parallel.get("layers_per_stage"):
        text += f" layers_per_stage {parallel['layers_per_stage']}"
    return text


def compare(row: dict[str, str], workers: int, top_k: int, free: dict[str, Any] = FREE) -> dict[str, Any]:
    published_config = row_config(row)
    published = simulate_training(published_config, RunOptions(fidelity="des")).metrics()
    start = time.perf_counter()
    result = run_search(search_config(row, top_k, free), SearchOptions(workers=workers)).to_json()
    wall = time.perf_counter() - start
    best = result["best"]
    p = dict(published_config["parallel"], dp=published["parallel"]["dp"])
    return {
        "row": row["row"],
        "published_plan": plan_text(p, published_config["training"]["micro_batch"]),
        "published_tokens_per_s": published["tokens_per_s"],
        "chosen_plan": plan_text(best["parallel"], best["training"]["micro_batch"]),
        "chosen_tokens_per_s": best["metrics"]["tokens_per_s"],
        "gain": best["metrics"]["tokens_per_s"] / published["tokens_per_s"] - 1.0,
        "screened": result["evaluated"],
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="comma-separated row ids (default: every Table 1 row)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--top", type=int, default=5, help="plans re-ranked with the DES per search")
    parser.add_argument("--features-2021", action="store_true", help="no ZeRO, no sequence parallelism")
    args = parser.parse_args()
    rows = [r for r in published_rows("training.csv") if r["row"].startswith("narayanan-") and "Table 1" in r["citation"]]
    if args.rows:
        wanted = args.rows.split(",")
        rows = [r for r in rows if r["row"] in wanted]
    print("| row | published plan | DES tokens/s | chosen plan | DES tokens/s | gain | screened | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    worst = float("inf")
    for row in rows:
        c = compare(row, args.workers, args.top, FEATURES_2021 if args.features_2021 else FREE)
        worst = min(worst, c["gain"])
        print(f"| {c['row']} | {c['published_plan']} | {c['published_tokens_per_s']:,.0f} | {c['chosen_plan']} | "
              f"{c['chosen_tokens_per_s']:,.0f} | {c['gain']:+.1%} | {c['screened']:,} | {c['wall_s']:.1f} |", flush=True)
    print(f"smallest gain: {worst:+.1%} (acceptance: >= 0)")
    return 0 if worst >= 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
