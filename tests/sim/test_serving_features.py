"""Prefix caching, the router policies, memory fit, config errors, and the CLI outputs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.runner import RunOptions, simulate
from sim.serving.config import SpeculativeSpec, parse_serving

BASE: dict[str, Any] = {
    "model": {"name": "llama3-8b"},
    "cluster": {"gpu": "a100-sxm-80gb"},
    "serving": {"tp": 1},
    "workload": {"arrival": "poisson", "rate_per_s": 8.0, "num_requests": 80, "prompt_tokens": 600,
                 "output_tokens": 20, "shared_prefix_tokens": 1024},
}


def _metrics(**serving: Any) -> dict[str, Any]:
    config = copy.deepcopy(BASE)
    config["serving"].update(serving)
    return simulate(config, RunOptions(seed=0)).metrics()


def test_prefix_caching_hits_skip_prefill() -> None:
    cold = _metrics()
    warm = _metrics(prefix_caching=True)
    assert cold["prefix_cache_hit_rate"] == 0.0
    assert warm["prefix_cache_hit_rate"] > 0.5  # 1,024 of 1,624 prompt tokens are shared
    assert warm["ttft_s"]["mean"] < 0.8 * cold["ttft_s"]["mean"]


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_router_spreads_requests_over_replicas(router: str) -> None:
    m = _metrics(replicas=3, router=router, prefix_caching=True)
    assert m["completed"] == 80 and m["num_gpus"] == 3
    steps = m["pools"][0]["steps"]
    assert len(steps) == 3 and all(s > 0 for s in steps)


def test_prefix_aware_router_follows_the_cache() -> None:
    spread = _metrics(replicas=3, router="round_robin", prefix_caching=True)
    aware = _metrics(replicas=3, router="prefix_aware", prefix_caching=True)
    assert aware["completed"] == 80
    assert aware["prefix_cache_hit_rate"] > spread["prefix_cache_hit_rate"]


def test_model_with_no_room_for_kv_is_one_error_with_the_sizes() -> None:
    """Nothing can be served: one error naming the weights and the budget (issue 12), not one
    rejection per request."""
    config = copy.deepcopy(BASE)
    config["model"] = {"name": "llama3-70b"}
    with pytest.raises(ConfigError, match=r"weights need 131\.\d\d GiB .* of the 72\.00 GiB per GPU"):
        simulate(config, RunOptions())


def test_expected_tokens_per_speculative_step() -> None:
    spec = SpeculativeSpec(method="draft_free", num_speculative_tokens=4, acceptance_rate=0.8)
    assert spec.expected_tokens_per_step() == pytest.approx((1 - 0.8**5) / 0.2, rel=1e-12)


@pytest.mark.parametrize(
    "table, fragment",
    [({"scheduler": "fcfs"}, "serving.scheduler = 'fcfs'; allowed"), ({"tp": 0}, "serving.tp = 0"),
     ({"speculative": {"acceptance_rate": 0.5}}, "needs num_speculative_tokens"),
     ({"disaggregated": {"prefill_gpus": 1}}, "unknown key 'prefill_gpus'")],
)
def test_bad_serving_input_names_field_and_allowed(table: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        parse_serving(table)
    assert fragment in str(info.value)


def test_cli_example_out_trace_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-h100-serving.toml"
    args = ["simulate", str(example), "--set", "workload.num_requests=30", "--format", "json",
            "--out", str(tmp_path), "--trace", str(tmp_path / "trace.json")]
    assert main(args) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 30
    assert (tmp_path / "requests.csv").read_text().count("\n") == 31
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["dur"] > 0 for e in trace)
    assert main(["simulate", str(example), "--set", "serving.router=random"]) == 2
    assert "serving.router = 'random'" in capsys.readouterr().err


def test_a_relative_trace_path_resolves_next_to_the_config(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json
    import shutil
    from pathlib import Path

    from sim.cli import main

    sample = Path(__file__).resolve().parents[1] / "data" / "azure_2023_conv_sample.csv"
    folder = tmp_path / "configs"
    folder.mkdir()
    shutil.copy(sample, folder / "trace.csv")
    (folder / "run.toml").write_text(
        '[model]\nname = "llama3-8b"\n[cluster]\ngpu = "a100-sxm-80gb"\n[serving]\ntp = 1\n'
        '[workload]\narrival = "trace"\ntrace = "trace.csv"\nnum_requests = 20\n'
    )
    assert main(["simulate", str(folder / "run.toml"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_requests"] == 20


def test_a_tensor_parallel_degree_that_cannot_split_the_heads_is_one_error_line(capsys) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from sim.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-h100-serving.toml"
    assert main(["simulate", str(example), "--set", "serving.tp=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serving.tp = 3 must divide the 64 attention heads" in err[0]
