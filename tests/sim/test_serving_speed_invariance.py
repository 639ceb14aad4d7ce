"""Speed work on the serving engine must not change its results: seeded runs of every scheduler
(memory pressure with recompute and swap preemption, prefix caching, speculative decoding,
disaggregation, several replicas) compared bit for bit with a checked-in golden.

The step cost is a synthetic function of the batch composition (tokens, keys, requests), so the
schedule still feeds back on time, yet the golden does not move when the cost model's accuracy is
improved (``hardware``/``stepcost`` changes are checked by their own tests; the engine prices a step
only through the ``step_cost(plan)`` callable it is given). Regenerate after an intentional change of
scheduling semantics with

    python tests/sim/test_serving_speed_invariance.py --regenerate
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if __name__ == "__main__":
    # Run as a script (--regenerate), sys.path[0] is tests/sim: put the repository root first so the
    # golden is computed by this checkout's code (without it the imports fail and nothing is rewritten).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sim.config import resolve_cluster
from sim.serving.config import parse_serving
from sim.serving.metrics import summarize
from sim.serving.plan import StepPlan
from sim.serving.request import SimRequest
from sim.serving.result import to_record
from sim.serving.run import build_system, run
from workloads.catalog import get_model

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "serving_speed_invariance.json"


def synthetic_step_s(plan: StepPlan) -> float:
    """A cost that depends on every aggregate of the batch (exact float arithmetic order)."""
    keys = 0
    for c in plan.chunks:
        keys += c.context_tokens + c.query_tokens
    return 2e-3 + 3e-5 * plan.num_tokens + 1e-8 * keys + 1e-4 * len(plan.chunks)


def _requests(seed: int, count: int, rate_per_s: float, *, prefix: bool = False) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))
    prompts = np.minimum(rng.lognormal(5.5, 0.8, size=count), 3000).astype(int) + 1
    outputs = np.minimum(rng.lognormal(4.0, 0.9, size=count), 500).astype(int) + 1
    out = []
    for i in range(count):
        hashes: tuple[int, ...] = ()
        if prefix:
            # 4 shared system prompts of 8 blocks (16 tokens each)
            group = int(rng.integers(0, 4))
            hashes = tuple(1000 * group + b for b in range(min(8, int(prompts[i]) // 16)))
        out.append(SimRequest(i, float(arrivals[i]), int(prompts[i]), int(outputs[i]), hashes))
    return out


SCENARIOS: dict[str, dict[str, Any]] = {
    "vllm_recompute": {"serving": {"scheduler": "vllm", "max_num_seqs": 64, "max_batched_tokens": 2048},
                       "capacity_blocks": 200, "rate": 80.0},
    "vllm_prefix_swap": {"serving": {"scheduler": "vllm", "max_num_seqs": 64, "max_batched_tokens": 1024,
                                     "prefix_caching": True, "preemption_mode": "swap", "swap_space_GiB": 0.5},
                         "capacity_blocks": 260, "rate": 80.0, "prefix": True},
    "vllm_v0": {"serving": {"scheduler": "vllm", "chunked_prefill": False, "max_num_seqs": 32},
                "capacity_blocks": 1500, "rate": 8.0},
    "sarathi": {"serving": {"scheduler": "sarathi", "chunk_size": 256, "max_num_seqs": 64},
                "capacity_blocks": 300, "rate": 60.0},
    "orca": {"serving": {"scheduler": "orca", "max_model_len": 2048, "max_num_seqs": 16},
             "capacity_blocks": 3000, "rate": 4.0},
    "static": {"serving": {"scheduler": "static", "max_num_seqs": 8}, "capacity_blocks": 3000, "rate": 4.0},
    "speculative": {"serving": {"scheduler": "vllm", "speculative": {"method": "draft_free", "num_speculative_tokens": 3,
                                                                     "acceptance_rate": 0.7}},
                    "capacity_blocks": 2000, "rate": 30.0},
    "disaggregated": {"serving": {"scheduler": "disaggregated",
                                  "disaggregated": {"prefill_replicas": 2, "decode_replicas": 1,
                                                    "prefill_tp": 1, "decode_tp": 1}},
                      "capacity_blocks": 1500, "rate": 60.0},
    "replicas_least_outstanding": {"serving": {"scheduler": "vllm", "replicas": 3, "router": "least_outstanding",
                                               "max_num_seqs": 32},
                                   "capacity_blocks": 250, "rate": 150.0},
}


def simulate_scenario(name: str, count: int = 250) -> dict[str, Any]:
    s = SCENARIOS[name]
    spec = parse_serving({"tp": 1, "block_size": 16, **s["serving"]})
    cluster = resolve_cluster({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}})
    system = build_system(
        spec, get_model("llama3-8b"), cluster, step_cost=synthetic_step_s,
        capacity_blocks=s["capacity_blocks"],
    )
    requests = _requests(7, count, s["rate"], prefix=s.get("prefix", False))
    replicas, rejected, _ = run(system, requests, rng=np.random.default_rng(11))
    records = [to_record(r) for r in requests]
    digest = hashlib.sha256()
    for r in records:
        digest.update(repr((r.request_id, r.first_scheduled_s, r.first_token_s, r.finish_s, r.token_times_s,
                            r.token_counts, r.preemptions, r.cached_prompt_tokens, r.rejected, r.replica)).encode())
    metrics = summarize(records)
    return {
        "records_sha256": digest.hexdigest(),
        "steps": [r.steps for r in replicas],
        "busy_s": [r.busy_s for r in replicas],
        "rejected": len(rejected),
        "metrics": json.loads(json.dumps(metrics)),
    }


def all_results() -> dict[str, Any]:
    return {name: simulate_scenario(name) for name in SCENARIOS}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_results_bit_identical_to_golden(name: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    got = simulate_scenario(name)
    expected = golden[name]
    assert got["steps"] == expected["steps"]
    assert got["busy_s"] == expected["busy_s"]  # exact floats (JSON round-trips repr)
    assert got["records_sha256"] == expected["records_sha256"]
    assert got["metrics"] == expected["metrics"]


def test_scenarios_exercise_what_they_claim() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert golden["vllm_recompute"]["metrics"]["preemptions"] > 0
    assert golden["vllm_prefix_swap"]["metrics"]["preemptions"] > 0
    assert golden["vllm_prefix_swap"]["metrics"]["prefix_cache_hit_rate"] > 0
    assert golden["disaggregated"]["steps"][2] > 0
    assert all(s > 0 for s in golden["replicas_least_outstanding"]["steps"])


if __name__ == "__main__":
    if "--regenerate" not in sys.argv:
        sys.exit("usage: python tests/sim/test_serving_speed_invariance.py --regenerate")
    GOLDEN.write_text(json.dumps(all_results(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.name}")
