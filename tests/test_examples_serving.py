"""Every serving example runs from the CLI (with fewer requests) and reports consistent metrics."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from sim.cli import main

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parent.parent / "examples").glob("*.toml")
                  if "serving" in tomllib.loads(p.read_text()) and "search" not in tomllib.loads(p.read_text()))


def _simulate(path: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> dict:
    argv = ["simulate", str(path), "--format", "json", "--set", "workload.num_requests=60"]
    for assignment in overrides:
        argv += ["--set", assignment]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 4 and all(p.read_text().startswith("# Covers:") for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_metrics_are_consistent(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = _simulate(path, capsys)
    assert m["completed"] + m["rejected"] + m["unfinished"] == m["num_requests"] == 60
    assert m["fits_in_memory"] and m["completed"] == 60
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        stats = m[metric]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"]
    assert m["e2e_s"]["mean"] >= m["ttft_s"]["mean"]
    assert m["output_tokens_per_s"] <= m["total_tokens_per_s"]


def test_speculation_pays_only_at_high_acceptance(capsys: pytest.CaptureFixture[str]) -> None:
    path = next(p for p in EXAMPLES if p.stem == "serve-speculative-a100")
    high = _simulate(path, capsys)["tpot_s"]["mean"]
    low = _simulate(path, capsys, "serving.speculative.acceptance_rate=0.2")["tpot_s"]["mean"]
    assert high < low


def test_prefix_caching_reuses_earlier_turns(capsys: pytest.CaptureFixture[str]) -> None:
    path = next(p for p in EXAMPLES if p.stem == "serve-prefix-caching-chat")
    cached = _simulate(path, capsys)
    uncached = _simulate(path, capsys, "serving.prefix_caching=false")
    # the shared system prompt and earlier turns are most of every later prompt
    assert cached["prefix_cache_hit_rate"] > 0.5 and uncached["prefix_cache_hit_rate"] == 0.0
    assert cached["ttft_s"]["mean"] < 0.7 * uncached["ttft_s"]["mean"]
