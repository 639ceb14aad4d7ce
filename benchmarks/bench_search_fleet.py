"""Planner speed (prints wall times): a fleet search over 3 GPU types x 8 instance shapes (target
<= 3 min on 2 cores) and an offload search (target <= 10 s).

Fleet scenario: Llama-3-8B chat traffic (Azure-conversation-like lognormal lengths, as
bench_serving.py) at 40 req/s, TTFT <= 1 s and TPOT <= 50 ms at p90, on A100-80GB, H100 and L40S
with tp 1/2/4/8 x vllm/sarathi (8 shapes per GPU type, all fit), catalog prices, one size bucket:
24 capacity bisections with the serving DES on a 2-process pool, the MILP, the re-simulation.
Offload scenario: examples/search-offload-opt-30b-t4.toml (FlexGen OPT-30B on one T4).

    python benchmarks/bench_search_fleet.py [--workers N] [--fleet-only | --offload-only]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from search.run import SearchOptions, run_search
from sim.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def fleet_config() -> dict:
    return {
        "model": {"name": "llama3-8b"},
        "workload": {
            "arrival": "poisson", "rate_per_s": 1.0, "num_requests": 200, "seed": 0,
            "prompt_tokens": {"distribution": "lognormal", "mu": 6.9, "sigma": 0.8, "max": 7000},
            "output_tokens": {"distribution": "lognormal", "mu": 4.9, "sigma": 0.9, "max": 1000},
        },
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90},
        "search": {
            "goal": "fleet", "target_rate_per_s": 40.0, "gpus": ["a100-sxm-80gb", "h100-sxm-80gb", "l40s"],
            "instance_tp": [1, 2, 4, 8], "schedulers": ["vllm", "sarathi"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fleet-only", action="store_true")
    group.add_argument("--offload-only", action="store_true")
    args = parser.parse_args()
    if not args.offload_only:
        start = time.perf_counter()
        result = run_search(fleet_config(), SearchOptions(workers=args.workers))
        wall = time.perf_counter() - start
        print(result.table())
        shapes = len(result.space.shapes)
        print(f"fleet search: {wall:.1f} s wall (target 180 s) for {shapes} shapes, {result.des_runs} DES runs, "
              f"{args.workers} workers; feasible {result.feasible}")
    if not args.fleet_only:
        start = time.perf_counter()
        result = run_search(load_config(ROOT / "examples" / "search-offload-opt-30b-t4.toml"), SearchOptions())
        wall = time.perf_counter() - start
        print(result.table())
        print(f"offload search: {wall:.1f} s wall (target 10 s), {result.evaluated} LPs, {len(result.runs)} simulated")


if __name__ == "__main__":
    main()
