"""Published speedup pairs (validation/pairs_suite.py): each side predicted through `llmsim simulate`,
held to the suite's thresholds, and the issue's fp8 pairs to 10 %."""

from __future__ import annotations

import json

import pytest

from hardware import units
from sim.cli import main
from sim.config import with_overrides
from sim.runner import RunOptions, simulate
from validation.pairs_suite import PAIR_THRESHOLDS, run_training_pairs_suite
from validation.published import SuiteReport
from validation.training_suite import published_rows


@pytest.fixture(scope="module")
def report() -> SuiteReport:
    return run_training_pairs_suite(fidelity="des")


def test_every_pair_runs_fits_and_is_counted(report: SuiteReport) -> None:
    assert len(report.rows("speedup")) == len(published_rows("training_pairs.csv")) == 9
    assert all(c.fits_in_memory and c.citation for c in report.comparisons)  # both runs of every pair fit


def test_thresholds_hold_at_both_fidelities(report: SuiteReport) -> None:
    analytic = run_training_pairs_suite(fidelity="analytic")
    assert not report.failures() and not analytic.failures(), (report.failures(), analytic.failures())
    assert PAIR_THRESHOLDS[0].max_mape <= 0.045 and PAIR_THRESHOLDS[0].max_row_error <= 0.069
    errors = {c.row.split(":")[0]: c.error for c in report.rows("speedup")}
    # torch.compile of torchtitan's eager chains (workloads.eager) within 4 % (within 1 % with memory-bound
    # kernels at the STREAM rate; the H100's 0.807 of it is one mean over kernels measured at 0.70-0.93 of it)
    assert 0.0 < errors["titan-llama31-8b-fsdp8"] < 0.04 and 0.0 < errors["titan-llama31-8b-fsdp128"] < 0.04
    # fp8 over bf16 within 10 % (the target), within 5 % today: Transformer Engine's 405B and torchao
    # float8 with its all-gathers in fp8 (fp8_all_gather, each cast on the sequence shard before its gather),
    # without and with async TP (-6.0 % for the async run before Inductor took the casts' amax, -11.6 % before
    # the casts ran on the shard)
    fp8_pairs = ("te-llama31-405b-2304", "titan-llama31-70b-tp8-vanilla", "titan-llama31-70b-tp8-async")
    assert all(abs(errors[row]) < 0.05 for row in fp8_pairs)
    # torch's async TP (tp_overlap_method symmetric_memory) on the 70B / 8B TP 8 runs: within 7.5 %
    assert all(abs(errors[row]) < 0.075 for row in ("titan-llama31-70b-tp8-bf16", "titan-llama31-70b-tp8-fp8",
                                                     "titan-llama31-8b-tp8-bf16"))


def test_a_pair_is_two_user_path_runs() -> None:
    row = published_rows("training_pairs.csv")[1]
    base = json.loads(row["base"])
    steps = [simulate(c, RunOptions(fidelity="des")).metrics()["iteration_time_s"]
             for c in (base, with_overrides(base, row["change"].split()))]
    pair = next(c for c in run_training_pairs_suite(fidelity="des").comparisons if c.row.startswith(row["row"]))
    assert pair.predicted == steps[0] / steps[1]
    assert pair.published == float(row["published_changed"]) / float(row["published_base"])


def test_cli_runs_the_suite_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--suite", "training-pairs", "--fidelity", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "== training-pairs ==" in out and "summary speedup" in out and "== training ==" not in out


def test_published_peak_memory_of_both_runs_through_the_user_path(report: SuiteReport) -> None:
    # A12's Llama 3.1 8B FSDP runs logged torchtitan's peak reserved memory (max_reserved_gib) on the
    # 96 GB part: 82.4 / 77.0 GiB on 8 GPUs (eager / compile), 67.0 / 62.0 on 128. Each run's predicted
    # peak is its `llmsim simulate` peak_memory_bytes; within 4 % with torch's cross-entropy holding
    # 12 B per logit at its peak (CROSS_ENTROPY_MEMORY), 17-27 % low when the loss held Megatron's 4 B.
    # Table 1's 70B FSDP 32 x TP 8 float8 full-AC runs (71.9 / 67.6 GiB) read 10-16 % low: reported (15-20 %
    # before torch's TP kept its gathered inputs whole, tp_gathered_input "save")
    memory = report.rows("peak_memory_bytes")
    assert [c.published / units.GiB for c in memory] == pytest.approx([82.4, 77.0, 67.0, 62.0, 71.9, 67.6])
    assert all(abs(c.error) < 0.04 for c in memory[:4]), [(c.row, c.error) for c in memory]
    assert all(-0.17 < c.error < -0.09 for c in memory[4:]), [(c.row, c.error) for c in memory]
    assert PAIR_THRESHOLDS[1].metric == "peak_memory_bytes" and PAIR_THRESHOLDS[1].max_row_error <= 0.157
    row = published_rows("training_pairs.csv")[1]
    base = json.loads(row["base"])
    assert memory[0].predicted == simulate(base, RunOptions(fidelity="des")).metrics()["peak_memory_bytes"]
    # the runs fit the published part (96 GB), not the catalog's 80 GB H100 standing in for it
    assert all(c.fits_in_memory for c in memory) and memory[0].predicted > 80 * units.GiB
