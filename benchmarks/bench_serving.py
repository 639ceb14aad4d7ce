"""Serving simulator speed (prints wall times).

Covers: the event loop (one event per batch step), the vLLM scheduler's per-step work and the
step-cost caches on large request streams.
Scenario: Azure-conversation-like lengths (lognormal prompts, median ~1,000 tokens; outputs median
~135; formulas.md "Public request traces": conv prompt p50 1,020, output p50 129, mean 211) on
Llama-3-70B TP8 H100 replicas under the vllm scheduler: 10,000 requests on one replica (target
<= 10 s) and 100,000 requests over 16 replicas (target <= 2 min), each at ~70 % of capacity.

    python benchmarks/bench_serving.py [--quick (10k only) | --profile (cProfile of the 10k run)]
"""

from __future__ import annotations

import time

from sim.runner import RunOptions, simulate


def config(num_requests: int, replicas: int, rate_per_s: float) -> dict:
    return {
        "model": {"name": "llama3-70b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8 * replicas},
        "serving": {"tp": 8, "scheduler": "vllm", "replicas": replicas, "router": "least_outstanding"},
        "workload": {
            "arrival": "poisson", "rate_per_s": rate_per_s, "num_requests": num_requests,
            "prompt_tokens": {"distribution": "lognormal", "mu": 6.9, "sigma": 0.8, "max": 7000},
            "output_tokens": {"distribution": "lognormal", "mu": 4.9, "sigma": 0.9, "max": 1000},
        },
    }


def bench(name: str, num_requests: int, replicas: int, rate_per_s: float, target_s: float) -> float:
    start = time.perf_counter()
    metrics = simulate(config(num_requests, replicas, rate_per_s), RunOptions(seed=0)).metrics()
    wall = time.perf_counter() - start
    steps = sum(sum(p["steps"]) for p in metrics["pools"])
    print(
        f"{name}: {wall:.2f} s wall (target {target_s:.0f} s), {metrics['completed']} completed, "
        f"{steps} batch steps, {metrics['output_tokens_per_s']:.0f} output tok/s simulated, "
        f"saturated={metrics['saturated']}"
    )
    return wall


def profile(num_requests: int, top: int = 15) -> None:
    """cProfile of the one-replica scenario: the functions with the most own time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    simulate(config(num_requests, 1, 5.0), RunOptions(seed=0)).metrics()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    import sys

    if "--profile" in sys.argv:
        profile(10_000)
        sys.exit(0)
    bench("10k requests, 1 replica", 10_000, 1, 5.0, 10.0)
    if "--quick" not in sys.argv:
        bench("100k requests, 16 replicas", 100_000, 16, 80.0, 120.0)
