"""Optimality of the training planner's screening against a plain exhaustive loop.

Covers: issue "Planner" acceptance: on GPT-3 175B on 1,024 A100 (batch 1,536, the 2021 Megatron-LM
stack) with every tp, pp, virtual-stage count, micro-batch, recompute mode and ZeRO stage free, the
search's best analytic plan equals the best found by looping over every combination through
``parse_training`` and ``estimate_training`` (no search code). The loop tries every v dividing the
layer count (a superset of the search's "auto", which keeps a stage's layers in equal chunks) and
every micro-batch dividing the batch. tests/search/test_training_search.py runs a reduced grid in CI.

    python benchmarks/search_optimality_gpt3_175b.py
"""

from __future__ import annotations

import copy
import itertools
import time

from search.run import SearchOptions, run_search
from sim.errors import ConfigError
from sim.training.config import parse_training
from sim.training.estimate import estimate_training
from sim.training.pricing_cache import PricingCache
from workloads.errors import InvalidPlanError

BASE = {
    "model": {"name": "gpt3-175b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1024, "node": "dgx-a100", "network": "ib-hdr-fat-tree"},
    "training": {"seq_len": 2048, "global_batch": 1536, "precision": "fp16", "framework": "megatron-2021"},
}
SCHEDULES = ["1f1b", "interleaved"]


def main() -> int:
    start = time.perf_counter()
    config = copy.deepcopy(BASE)
    config["search"] = {"goal": "training", "top_k": 1, "schedule": SCHEDULES, "sequence_parallel": [True]}
    result = run_search(config, SearchOptions(workers=1))
    screened = [r for r in result.rows if r.metrics is not None and not r.violates]
    search_best = max(screened, key=lambda r: r.metrics[1])
    search_s = time.perf_counter() - start
    print(f"search: {result.funnel.screened:,} screened, best {search_best.metrics[1]:,.1f} tokens/s "
          f"({search_best.candidate}) in {search_s:.0f} s")
    layers, batch, gpus = 96, 1536, 1024
    cache = PricingCache()
    best, best_plan, tried = 0.0, None, 0
    start = time.perf_counter()
    for tp, pp in itertools.product((1, 2, 4, 8), [p for p in range(1, layers + 1) if gpus % p == 0]):
        if gpus % (tp * pp):
            continue
        dp = gpus // (tp * pp)
        for schedule, v, mb, recompute, zero in itertools.product(
            SCHEDULES, [v for v in range(1, layers + 1) if layers % v == 0], range(1, batch + 1),
            ("none", "selective", "full"), (0, 1, 2, 3),
        ):
            if batch % (dp * mb) or (schedule != "interleaved" and v > 1):
                continue
            candidate = copy.deepcopy(BASE)
            candidate["training"]["micro_batch"] = mb
            candidate["parallel"] = {"tp": tp, "pp": pp, "zero": zero, "recompute": recompute, "schedule": schedule,
                                     "virtual_stages": v, "sequence_parallel": True}
            try:
                metrics = estimate_training(parse_training(candidate), cache)
            except (InvalidPlanError, ConfigError):
                continue
            tried += 1
            if metrics["fits_in_memory"] and metrics["tokens_per_s"] > best:
                best, best_plan = metrics["tokens_per_s"], (tp, pp, schedule, v, mb, recompute, zero)
    print(f"exhaustive loop: {tried:,} valid plans, best {best:,.1f} tokens/s {best_plan} "
          f"in {time.perf_counter() - start:.0f} s")
    print("equal" if best == search_best.metrics[1] else f"DIFFERENT: search {search_best.metrics[1]} vs {best}")
    return 0 if best == search_best.metrics[1] else 1


if __name__ == "__main__":
    raise SystemExit(main())
