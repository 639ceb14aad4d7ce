"""Published serving results (validation/published/serving.csv) against llmsim's serving cost model."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from sim.serving.analytic import static_batch_times
from sim.serving.config import parse_serving
from sim.serving.request import SimRequest
from sim.serving.run import build_system, run
from hardware.catalog import get_gpu, get_network, get_node
from hardware.topology import build_cluster
from sim.serving.stepcost import ReplicaShape, StepCostModel
from workloads.catalog import get_model
from validation.serving_suite import load_rows, row_config, run_serving_suite


@functools.cache
def _report():  # type: ignore[no-untyped-def]
    return run_serving_suite()


def test_every_published_row_is_present_and_cited() -> None:
    rows = [r for r in load_rows() if r.benchmark == "static"]
    inflight = [r for r in load_rows() if r.benchmark == "inflight"]
    assert len(inflight) == 16 and all(r.framework == "trtllm" for r in inflight)
    # each in-flight row queues the benchmark's own number of requests: the 0.14 perf-overview's
    # $num_requests table (docs/source/performance/perf-overview.md, "Preparing a Dataset")
    num_requests = {(128, 128): 30000, (2048, 128): 3000, (2048, 2048): 1500, (5000, 500): 1500,
                    (1000, 1000): 3000, (500, 2000): 3000}
    assert all(r.batch == num_requests[r.input_tokens, r.output_tokens] for r in inflight)
    metrics = [r.metric for r in rows]
    assert metrics.count("output_tokens_per_s_per_gpu") == 24  # TensorRT-LLM v0.9.0 throughput table
    assert metrics.count("first_token_latency_s") == 12  # 6 models x 2 input lengths
    assert sum(r.framework == "fastertransformer" for r in rows) == 6
    assert all(r.citation for r in rows)


def test_regression_bounds_of_the_current_model() -> None:
    # What the model achieves now (see the per-row table of `llmsim validate --suite serving`); a
    # change that makes it worse fails here.
    report = _report()
    assert report.mape("output_tokens_per_s_per_gpu") <= 0.065  # 6.1 % (Mixtral b32 2048/2048 not counted; 6.5 % before the A100 sustained clock)
    assert report.mape("first_token_latency_s") <= 0.13  # 12.1 % (Mixtral 128/1 not counted; 13.9 % before the A100 sustained clock)
    for label in ("falcon-180b tp8 b512 128/2048", "falcon-180b tp8 b64 2048/2048"):
        # the per-query-head (masked-MHA) decode kernel brings these from +39 % to within 10 %
        (row,) = [c for c in report.comparisons if c.row == label]
        assert abs(row.predicted / row.published - 1.0) <= 0.10
    for metric in ("prefill_latency_s", "decode_latency_per_token_s", "total_latency_s"):
        assert report.worst(metric) <= 0.15  # FasterTransformer 13B rows


def test_issue_thresholds() -> None:
    # throughput MAPE <= 15 % with no row worse than 30 % (issue 4); first-token latency MAPE <= 15 % (issue 11)
    report = _report()
    assert not report.failures(), report.failures()
    assert report.mape("first_token_latency_s") <= 0.15


def test_rows_above_the_physical_bound_are_reported_not_counted() -> None:
    """One rule for every throughput and first-token row: a published number past the HBM roofline of
    the bytes the row must read at the GPU's best measured bandwidth (A100 80GB: gpu-stream 1,760 of
    2,039 GB/s) is reported with the reason, not counted. Mixtral b32 2048/2048 (801 tok/s/GPU) needs
    the experts that 32 tokens x top-2 of 8 activate (E (1 - (3/4)^32) ~ 8) plus the KV cache every step;
    Mixtral 128/1 (23.8 ms) needs the 46.7 GB per GPU that 128 tokens' top-2 routing activates."""
    from validation.published import Report
    from validation.serving_suite import (hbm_roofline_first_token_s, hbm_roofline_tokens_per_s_per_gpu,
                                          measured_hbm_Bps, roofline_exclusion)

    report = _report()
    excluded = {c.row: c.excluded for c in report.comparisons if c.excluded}
    assert sorted(excluded) == ["mixtral-8x7b tp2 b1 128/1", "mixtral-8x7b tp2 b32 2048/2048"]
    assert "HBM roofline 530 tok/s/GPU" in excluded["mixtral-8x7b tp2 b32 2048/2048"]
    assert "below the 26.5 ms" in excluded["mixtral-8x7b tp2 b1 128/1"]
    table = Report(suites=(report,)).table()
    assert "(not counted: published 801 exceeds the HBM roofline" in table
    assert "(not counted: published 23.8 ms is below" in table
    assert measured_hbm_Bps(load_rows()[0]) == pytest.approx(2039e9 * 0.863)
    # closed form of the first-token bound: Mixtral's 46.7 B parameters (all 8 experts active) in fp16
    # over 2 GPUs at 1,760 GB/s
    (mixtral,) = [r for r in load_rows() if r.label == "mixtral-8x7b tp2 b1 128/1"]
    assert hbm_roofline_first_token_s(mixtral) == pytest.approx(46.7e9 * 2 / 2 / (2039e9 * 0.863), rel=0.01)
    # every counted row is inside its own roofline, and the rule is the same for every suite's rows
    for row in load_rows():
        if row.metric == "output_tokens_per_s_per_gpu" and row.label not in excluded:
            assert row.published <= hbm_roofline_tokens_per_s_per_gpu(row)
        if row.metric == "first_token_latency_s" and row.label not in excluded:
            assert row.published >= hbm_roofline_first_token_s(row)
        assert bool(roofline_exclusion(row)) == (row.label in excluded)


def test_static_batch_closed_form_equals_the_des() -> None:
    # static_batch_times (the closed form) and the DES static scheduler give the same timeline for a
    # static batch of identical requests (rel 1e-9: same arithmetic, summed in order)
    gpu = get_gpu("a100-sxm-80gb")
    node = get_node(gpu.default_node)
    shape = ReplicaShape(model=get_model("llama2-7b"), cluster=build_cluster(gpu, node, get_network(node.default_network), 1),
                         tp=1, weight_precision="fp16", kv_precision="fp16", activation_precision="fp16")
    cost = StepCostModel(shape, step_overhead_s=0.0, request_overhead_s=0.0)
    batch, isl, osl = 8, 256, 16
    closed = static_batch_times(cost, batch=batch, input_tokens=isl, output_tokens=osl)
    spec = parse_serving({"tp": 1, "scheduler": "static", "max_num_seqs": batch, "step_overhead_us": 0.0,
                          "request_overhead_us": 0.0})
    system = build_system(spec, cost.shape.model, cost.shape.cluster, step_cost=cost.step_time_s, capacity_blocks=10_000)
    requests = [SimRequest(i, 0.0, isl, osl) for i in range(batch)]
    run(system, requests, rng=np.random.default_rng(0))
    assert requests[0].first_token_s == pytest.approx(closed.prefill_s, rel=1e-9)
    assert max(r.finish_s for r in requests) == pytest.approx(closed.total_s, rel=1e-9)  # type: ignore[type-var]


def test_every_row_runs_the_user_path() -> None:
    # each row's prediction is what `llmsim simulate` gives on the config `llmsim validate -v` prints
    import tomllib

    from sim.runner import RunOptions, simulate
    from sim.toml_writer import dumps

    report = _report()
    row = next(r for r in load_rows() if r.model == "llama2-7b" and r.batch == 32 and r.output_tokens == 128)
    (comparison,) = [c for c in report.comparisons if c.row == row.label and c.metric == row.metric]
    config = tomllib.loads(dumps(comparison.config))
    assert config == row_config(row) and config["serving"]["framework"] == "trtllm-0.9"
    metrics = simulate(config, RunOptions()).metrics()
    assert metrics["framework"] == "trtllm-0.9"
    assert metrics["output_tokens_per_s"] / row.tp == comparison.predicted


def test_trtllm_bench_engine_settings_follow_its_build_heuristic() -> None:
    # trtllm-bench build --dataset (calc_engine_setting / finetune_setting), worked by hand:
    # the GPU memory is NVML's total (get_device_memory): 81,559 MiB = 79.65 GiB on an H100 SXM 80GB.
    # 70B TP8 1000/1000: (8 x 79.65 GiB - 70.55 x 2 GB) x 0.95 / (2 x 80 x 8 x 128 x 2 B / GiB) = 1.54 M
    # tokens = 772 requests -> batch 128 x ceil(772/128) = 896; tokens 772 x 2 = 1,544 -> floor 2,048.
    # 8B TP1 128/128: 1,933 requests -> 256 x 8 = 2,048; 3,866 tokens -> 256 x 16 = 4,096.
    # 70B TP2 128/128: (2 x 79.65 - 141.1) x 0.95 / (0.3125 MiB x 256) = 221 requests -> 32 x 7 = 224
    # (230 -> 256 with the datasheet's 80 GiB)
    from validation.serving_suite import trtllm_bench_engine_settings

    settings = {r.label: trtllm_bench_engine_settings(r) for r in load_rows() if r.benchmark == "inflight"}
    assert settings["trtllm llama3-70b tp8 1000/1000"] == (896, 2048)
    assert settings["trtllm llama3-8b tp1 128/128"] == (2048, 4096)
    assert settings["trtllm llama3-70b tp8 2048/128"] == (768, 12288)  # 709 requests x 17 tokens each
    assert settings["trtllm llama3-70b tp2 1000/1000"] == (64, 2048)  # the floors: 28 requests fit
    assert settings["trtllm llama3-70b tp2 128/128"] == (224, 2048)
    (row,) = [r for r in load_rows() if r.label == "trtllm llama3-70b tp8 1000/1000"]
    serving = row_config(row)["serving"]
    assert (serving["scheduler"], serving["chunked_prefill"]) == ("inflight", True)
    assert (serving["max_num_seqs"], serving["max_batched_tokens"]) == (896, 2048)
    # 64-token KV blocks come from the row's stack profile, not the row
    from sim.serving.config import parse_serving

    assert "block_size" not in serving and parse_serving(serving).block_size == 64


def test_trtllm_014_inflight_rows_and_the_kv_cliff() -> None:
    # TensorRT-LLM 0.14 trtllm-bench rows through the user path, each at the benchmark's own request count:
    # the issue's 10 % target is not met (10.1 %, worst +21.5 %, every row over-predicted), the bounds stop
    # regressions; the KV-capacity cliff of 70B on two H100 is
    # reproduced; the shipped profile does not make the suite worse than the analytic defaults (issue 9)
    from validation.serving_suite import INFLIGHT_THRESHOLDS, run_serving_inflight_suite

    report = run_serving_inflight_suite()
    assert not report.failures(), report.failures()
    assert INFLIGHT_THRESHOLDS[0].max_mape <= 0.102 and INFLIGHT_THRESHOLDS[0].max_row_error <= 0.216
    (cliff,) = [c for c in report.comparisons if c.row == "trtllm llama3-70b tp2 1000/1000"]
    assert abs(cliff.error) <= 0.18  # +17.6 %: over-predicted as the other large-batch rows
    (four,) = [c for c in report.comparisons if c.row == "trtllm llama3-70b tp4 1000/1000"]
    assert four.predicted > 2 * cliff.predicted  # the cliff: 2 GPUs hold only a few sequences' KV
    off = run_serving_inflight_suite(calibration="none")
    metric = "output_tokens_per_s_per_gpu"
    assert report.mape(metric) <= off.mape(metric) and report.worst(metric) <= off.worst(metric)


def test_nanoflow_baselines() -> None:
    # NanoFlow's TensorRT-LLM v0.8 and vLLM v0.5.3 baselines (LLaMA-2-70B TP8, 8 x A100, offline) through
    # the user path. TensorRT-LLM rows +2.7 to +3.9 % today (+3.0 to +4.1 % before the stack's 270 us per step, -1.4 to +1.0 % before the all-reduce plugin's
    # kernel launch; 70B TP4 small-batch latency held out in test_trtllm_014_online); vLLM rows, on the "vllm-0.5" V0 stack through
    # its in-process OpenAI server (NanoFlow ran benchmark_serving.py), -5.1 to +5.0 % (+18 to +25 % without
    # the server's per-token cost, 59-67 % on the V1 profile): bounds near today's errors
    from validation.serving_suite import run_serving_nanoflow_suite

    report = run_serving_nanoflow_suite()
    assert not report.failures(), report.failures()
    rows = {c.row: c.error for c in report.comparisons}
    assert len(rows) == 6
    trtllm = [e for r, e in rows.items() if " trtllm " in r]
    vllm = [e for r, e in rows.items() if " vllm-0.5 " in r]
    assert len(trtllm) == len(vllm) == 3
    assert all(abs(e) <= 0.040 for e in trtllm)
    assert all(abs(e) <= 0.06 for e in vllm)
    assert report.mape("total_tokens_per_s_per_gpu") <= 0.043


def test_validate_runs_one_suite_alone_from_the_cli(capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from sim.cli import build_parser, main
    from validation.published import SINGLE_SUITES, SUITES
    from validation.serving_suite import run_serving_nanoflow_suite

    suite_choices = next(a for a in build_parser()._subparsers._group_actions[0].choices["validate"]._actions
                         if a.dest == "suite").choices
    assert set(suite_choices) == {*SUITES, "all", *SINGLE_SUITES}
    main(["validate", "--suite", "serving-nanoflow", "--format", "json"])
    suites = json.loads(capsys.readouterr().out)["suites"]
    assert list(suites) == ["serving-nanoflow"]
    metric = "total_tokens_per_s_per_gpu"
    assert suites["serving-nanoflow"]["summary"][metric]["mape"] == run_serving_nanoflow_suite().mape(metric)
