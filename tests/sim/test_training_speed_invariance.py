"""Speed work must not change a number: training predictions against a checked-in golden.

The golden (tests/golden/training_suite_predictions.json) holds, for every row of
validation/published/training.csv, the analytic and DES iteration times, plus the full analytic
metrics of extra configurations that exercise the branches the suite rows do not (ZeRO 1-3, HSDP,
context and expert parallelism, offload, every schedule, uneven stages, fp8, no DP overlap).
When the model changes on purpose, regenerate it:

    python tests/sim/test_training_speed_invariance.py --regenerate
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":
    # Run as a script (--regenerate), sys.path[0] is tests/sim: put the repository root first so the
    # golden is computed by this checkout's code (without it the imports fail and nothing is rewritten).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "training_suite_predictions.json"
# Caching and sharing priced work is exact arithmetic reuse: only float summation order may differ.
REL = 1e-12


def _cluster(gpu: str, num_gpus: int) -> dict[str, Any]:
    return {"gpu": gpu, "num_gpus": num_gpus}


def extra_configs() -> dict[str, dict[str, Any]]:
    """Configurations covering plan features outside the published rows (small and fast)."""
    gpt = {"name": "gpt3-175b"}
    llama = {"name": "llama3-70b"}
    mixtral = {"name": "mixtral-8x7b"}
    train = {"seq_len": 2048, "global_batch": 512, "micro_batch": 1, "precision": "bf16"}

    def config(model: dict[str, Any], cluster: dict[str, Any], parallel: dict[str, Any], **training: Any) -> dict[str, Any]:
        return {"model": model, "cluster": cluster, "training": {**train, **training}, "parallel": parallel}

    a100_1k, h100_1k = _cluster("a100-sxm-80gb", 1024), _cluster("h100-sxm-80gb", 1024)
    return {
        "gpt175-zero0-1f1b": config(gpt, a100_1k, {"tp": 8, "pp": 8, "zero": 0, "sequence_parallel": True}),
        "gpt175-zero1-interleaved": config(
            gpt, a100_1k, {"tp": 8, "pp": 8, "zero": 1, "schedule": "interleaved", "virtual_stages": 2,
                           "recompute": "selective", "sequence_parallel": True}),
        "gpt175-zero2-gpipe": config(gpt, a100_1k, {"tp": 8, "pp": 16, "zero": 2, "schedule": "gpipe", "recompute": "full"}),
        "gpt175-zero3-zbh1": config(gpt, a100_1k, {"tp": 4, "pp": 8, "zero": 3, "schedule": "zb-h1"}, micro_batch=2),
        "gpt175-hsdp": config(gpt, h100_1k, {"tp": 2, "pp": 8, "zero": 3, "hsdp": True, "recompute": "full"}),
        "gpt175-no-dp-overlap": config(gpt, a100_1k, {"tp": 8, "pp": 8, "zero": 1, "dp_comm_overlap": False}),
        "gpt175-tp-overlap-fp8": config(
            gpt, h100_1k, {"tp": 8, "pp": 4, "zero": 1, "sequence_parallel": True, "tp_comm_overlap": True,
                           "recompute": "selective"}, precision="fp8"),
        "gpt175-uneven": config(
            gpt, a100_1k, {"tp": 8, "pp": 4, "layers_per_stage": [23, 25, 25, 23], "recompute": "full"}),
        "gpt175-fp16-unfused": config(
            gpt, a100_1k, {"tp": 8, "pp": 8, "recompute": "full"}, precision="fp16", attention_kernel="unfused"),
        "llama70-cp2": config(
            llama, h100_1k, {"tp": 4, "pp": 4, "cp": 2, "zero": 1, "sequence_parallel": True}, seq_len=8192),
        "llama70-cp2-all-gather": config(
            llama, h100_1k, {"tp": 4, "pp": 4, "cp": 2, "zero": 1, "sequence_parallel": True, "cp_comm": "all_gather"},
            seq_len=8192),
        "llama70-offload-opt": config(llama, _cluster("h100-sxm-80gb", 64), {"tp": 8, "pp": 1, "zero": 1, "offload": "optimizer"}),
        "llama70-offload-nvme": config(llama, _cluster("h100-sxm-80gb", 64), {"tp": 8, "pp": 2, "zero": 1, "offload": "nvme"}),
        "llama70-pp-only": config(llama, _cluster("a100-sxm-80gb", 16), {"tp": 1, "pp": 16, "recompute": "full"}, global_batch=64),
        "mixtral-ep": config(
            mixtral, h100_1k, {"tp": 2, "pp": 4, "ep": 8, "zero": 1, "sequence_parallel": True, "expert_load_imbalance": 1.2}),
        "mixtral-ep-interleaved": config(
            mixtral, _cluster("h100-sxm-80gb", 256), {"tp": 1, "pp": 4, "ep": 4, "schedule": "interleaved",
                                                      "virtual_stages": 2, "zero": 3}),
    }


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, item, out)
    elif isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, (int, float)):
        out[prefix] = float(value)


def compute_predictions() -> dict[str, Any]:
    from sim.runner import RunOptions
    from sim.training.run import simulate_training
    from validation.training_suite import iteration_rows

    analytic = {r.row: r.predicted_s for r in iteration_rows("analytic")}
    des = {r.row: r.predicted_s for r in iteration_rows("des")}
    extra: dict[str, dict[str, float]] = {}
    for name, config in extra_configs().items():
        metrics: dict[str, float] = {}
        _flatten("", simulate_training(config, RunOptions(fidelity="analytic")).metrics(), metrics)
        extra[name] = metrics
    return {
        "suite": {row: {"analytic": analytic[row], "des": des[row]} for row in analytic},
        "extra_analytic": extra,
    }


def _compare(expected: Any, actual: Any, where: str, errors: list[str]) -> None:
    if isinstance(expected, dict):
        if set(expected) != set(actual):
            errors.append(f"{where}: keys differ: {sorted(set(expected) ^ set(actual))}")
        for key in expected.keys() & actual.keys():
            _compare(expected[key], actual[key], f"{where}.{key}", errors)
    elif not math.isclose(expected, actual, rel_tol=REL, abs_tol=0.0):
        errors.append(f"{where}: golden {expected!r} != now {actual!r}")


@pytest.fixture(scope="module")
def predictions() -> dict[str, Any]:
    return compute_predictions()


def test_predictions_match_golden(predictions: dict[str, Any]) -> None:
    golden = json.loads(GOLDEN.read_text())
    errors: list[str] = []
    _compare(golden, predictions, "golden", errors)
    assert not errors, "\n".join(errors[:20])


def test_golden_covers_every_published_row(predictions: dict[str, Any]) -> None:
    from validation.training_suite import PUBLISHED_DIR

    rows = (PUBLISHED_DIR / "training.csv").read_text().splitlines()[1:]
    assert len(predictions["suite"]) == len([r for r in rows if r.strip()]) > 0


def test_cache_keys_cover_every_setup_field() -> None:
    """``pricing_keys`` names every TrainingSetup field; a new field must join the key (or this test)."""
    import dataclasses
    import inspect

    from sim.training import iteration
    from sim.training.config import TrainingSetup

    source = inspect.getsource(iteration.pricing_keys)
    missing = [
        f.name for f in dataclasses.fields(TrainingSetup)
        if f"setup.{f.name}" not in source and f.name not in iteration.SETUP_FIELDS_AFTER_MEMO
    ]
    assert missing == []


def test_shared_cache_gives_the_same_metrics() -> None:
    """One PricingCache across different plans returns what a fresh evaluation returns."""
    from sim.runner import RunOptions
    from sim.training.config import parse_training
    from sim.training.estimate import estimate_training
    from sim.training.pricing_cache import PricingCache
    from sim.training.run import simulate_training

    cache = PricingCache(max_entries=8)  # small: exercises eviction too
    configs = list(extra_configs().values())
    for config in configs + configs[::-1]:
        shared = estimate_training(parse_training(config), cache)
        fresh = simulate_training(config, RunOptions(fidelity="analytic")).metrics()
        fresh.pop("cost_sources")  # simulate's account of its op costs; the search fast path skips it
        assert shared == fresh


def test_compare_detects_a_change() -> None:
    errors: list[str] = []
    _compare({"a": {"b": 1.0}}, {"a": {"b": 1.0 + 1e-9}}, "x", errors)
    assert errors == ["x.a.b: golden 1.0 != now 1.000000001"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        raise SystemExit(f"usage: python {Path(__file__).name} --regenerate")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(compute_predictions(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(Path.cwd()) if GOLDEN.is_relative_to(Path.cwd()) else GOLDEN.name}")
