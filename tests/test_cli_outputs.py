"""Output people read (issue 12), through the CLI: speculation statistics, published comparisons,
catalog entries without sources, sweep tables with one format per column, sweep plots and the
pipeline timeline, and per-GPU / per-replica quantities kept apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SPECULATIVE = ROOT / "examples" / "serve-speculative-a100.toml"
SERVING = ROOT / "examples" / "llama3-70b-h100-serving.toml"
TRAINING = ROOT / "examples" / "train-zb-h1.toml"
GPT3 = ROOT / "examples" / "gpt3-175b-a100.toml"


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_speculation_statistics_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", SPECULATIVE, "--set", "workload.num_requests=30", "--format", "json")
    spec = json.loads(out)["speculative"]
    assert code == 0 and spec["num_speculative_tokens"] == 4
    assert spec["expected_tokens_per_step"] == pytest.approx((1 - 0.8**5) / 0.2)
    # 30 requests x 255 decode tokens / ~3.3 per step: ~2,300 verifications, sampling error ~1.5 %
    assert spec["accepted_tokens_per_step"] == pytest.approx(spec["expected_tokens_per_step"], rel=0.05)
    assert 0.05 < spec["draft_time_share"] < 0.95


def test_speculation_at_full_acceptance_and_free_drafts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", SPECULATIVE, "--set", "workload.num_requests=10", "--format", "json",
                       "--set", "serving.speculative={method='draft_free', num_speculative_tokens=3, acceptance_rate=1.0}")
    spec = json.loads(out)["speculative"]
    assert code == 0 and spec["draft_time_share"] == 0.0
    # every verification emits k + 1 = 4 tokens except where the output runs out (255 = 63 x 4 + 3)
    assert spec["accepted_tokens_per_step"] == pytest.approx(255 / 64)
    code, out, _ = run(capsys, "simulate", SPECULATIVE, "--set", "workload.num_requests=10")
    assert "speculation k=4 alpha=0.8:" in out and "tokens per decode step (expected 3.36); drafting" in out


def test_examples_that_cite_a_published_number_print_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", GPT3, "--fidelity", "analytic", "--format", "json")
    data = json.loads(out)
    row = data["published"]["metrics"]["hardware_tflops_per_gpu"]
    assert code == 0 and row["published"] == 140.0 and "Narayanan" in data["published"]["source"]
    hardware = data["model_flops_per_s_per_gpu"] * data["hfu"] / data["mfu"] / 1e12
    assert row["predicted"] == pytest.approx(hardware) and row["error"] == pytest.approx(hardware / 140 - 1)
    code, out, _ = run(capsys, "simulate", GPT3, "--fidelity", "analytic")
    assert re.search(r"TFLOP/s per GPU counting recompute\s+published 140  predicted [\d.]+  error [+-]\d+\.\d%", out)


def test_405b_example_prints_its_published_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", ROOT / "examples" / "train-llama3.1-405b-cp.toml", "--fidelity", "analytic")
    assert code == 0 and "published (Dubey et al. 2024" in out and "model TFLOP/s per GPU                published 380" in out


def test_published_section_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", GPT3, "--fidelity", "analytic", "--set", "published.mfu_pct=40")
    assert code == 2 and "[published] unknown key 'mfu_pct'" in err


def test_catalog_show_says_not_set(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "catalog", "show", "t4")
    assert code == 0 and not re.search(r"\sNone$|\s0 GB/s", out, re.M)
    assert re.search(r"l2_bandwidth_Bps\s+not set", out) and re.search(r"efficiency.gemm_memory\s+not set", out)
    code, out, _ = run(capsys, "catalog", "show", "h100-pcie-80gb")
    assert re.search(r"l2_bandwidth_Bps\s+6900 GB/s", out)


def test_training_sweep_table_has_one_format_per_column(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "simulate", GPT3, "--fidelity", "analytic", "--sweep", "training.micro_batch=1,2",
                       "--out", tmp_path)
    header, *rows = out.splitlines()
    assert code == 0 and "iteration time (s)" in header and "peak memory per GPU (GiB)" in header and "MFU (%)" in header
    for row in rows:
        cells = row.split()
        assert re.fullmatch(r"\d+\.\d{3}", cells[1])  # seconds, three decimals
        assert re.fullmatch(r"\d{1,3}(,\d{3})+", cells[2])  # tokens/s with thousands separators
        assert re.fullmatch(r"\d+\.\d", cells[3])  # percent
        assert re.fullmatch(r"\d+\.\d{2}", cells[5])  # GiB
    assert (tmp_path / "sweep_peak_memory_bytes.png").stat().st_size > 0


def test_serving_sweep_table_is_narrow(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", SERVING, "--set", "workload.num_requests=20", "--sweep", "workload.rate_per_s=2,4")
    header = out.splitlines()[0]
    assert code == 0 and len(header) <= 160 and "TTFT p99 (s)" in header and "itl" not in header.lower()


def test_reference_lines_for_sweep_plots(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli_support import reference_lines
    from sim.config import load_config
    from sim.runner import RunOptions, simulate

    lines = reference_lines(simulate(load_config(SERVING, ["workload.num_requests=5"]), RunOptions()))
    assert lines["ttft_s.p99"] == (2.0, "SLO TTFT 2 s") and lines["tpot_s.p50"][0] == 0.1


def test_pipeline_timeline_reaches_the_steady_state(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.training.trace as trace

    seen = {}
    original = trace.plot_pipeline_timeline

    def spy(events, path, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return original(events, path, **kwargs)

    monkeypatch.setattr(trace, "plot_pipeline_timeline", spy)
    code, _, _ = run(capsys, "simulate", TRAINING, "--out", tmp_path, "--trace")
    assert code == 0 and (tmp_path / "pipeline_timeline.png").stat().st_size > 0
    # 8 stages: the warm-up holds 8 micro-batches, so 2 x 8 + 2 = 18 of the 32 are drawn
    assert seen == {"max_microbatches": 18, "total_microbatches": 32}


def test_serving_table_keeps_per_gpu_and_per_replica_apart(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", SERVING, "--set", "workload.num_requests=5")
    pool = out.splitlines()[1]
    assert code == 0 and re.search(r"per GPU: weights [\d.]+ GiB, KV [\d.]+ GiB; per replica: KV room for [\d,]+ tokens", pool)


def test_fp8_mfu_names_its_peak(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", ROOT / "examples" / "train-fp8-h100.toml", "--fidelity", "analytic")
    assert code == 0 and "(of the fp8 dense peak, 1,979 TFLOP/s)" in out
    code, out, _ = run(capsys, "simulate", ROOT / "examples" / "train-fp8-h100.toml", "--fidelity", "analytic", "--format", "json")
    assert json.loads(out)["mfu_peak_precision"] == "fp8"


def test_disaggregated_example_shows_the_distserve_claim(capsys: pytest.CaptureFixture[str]) -> None:
    """Long prompts under a tight TPOT: the same 8 GPUs meet the SLO disaggregated, not colocated."""
    example = ROOT / "examples" / "serve-disaggregated-h100.toml"
    base = ("--set", "workload.num_requests=200", "--format", "json")
    _, out, _ = run(capsys, "simulate", example, *base)
    split = json.loads(out)
    _, out, _ = run(capsys, "simulate", example, *base, "--set", 'serving.scheduler="vllm"', "--set", "serving.tp=2",
                    "--set", "serving.replicas=4")
    colocated = json.loads(out)
    assert split["num_gpus"] == colocated["num_gpus"] == 8
    assert split["slo_attainment"] >= 0.95 and colocated["slo_attainment"] <= 0.6
    assert split["tpot_s"]["p90"] < 0.0105 < colocated["tpot_s"]["p90"]
    assert split["goodput_requests_per_s"] > 1.5 * colocated["goodput_requests_per_s"]
