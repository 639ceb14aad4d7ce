"""Microbenchmark harness: measurement schema, timing statistics (fake clock), CSV writing, and the
harness itself on the CPU device when PyTorch is installed (CI has no PyTorch: PyPI's build is the
multi-GB CUDA one, so that test skips there and says why)."""

from __future__ import annotations

import importlib.util

import pytest

from sim.cli import main
from validation.microbench import schema, timing


def test_measure_takes_the_median_after_warmup_and_rotates_inputs() -> None:
    calls: list[int] = []
    samples = iter([5.0, 1.0, 3.0, 100.0, 2.0])

    class FakeTimer:
        def time_call(self, fn):
            fn()
            return next(samples)

    stats = timing.measure(lambda i: (lambda: calls.append(i)), sets=3, timer=FakeTimer(), warmup=2, repeats=5)
    assert calls == [0, 1, 2, 0, 1, 2, 0]  # 2 warm-up calls, then 5 timed, cycling through 3 input sets
    assert stats.median_s == 3.0 and stats.min_s == 1.0 and stats.max_s == 100.0 and stats.repeats == 5


def test_perf_counter_timer_synchronizes_around_the_call() -> None:
    events: list[str] = []
    ticks = iter([10.0, 10.25])
    timer = timing.PerfCounterTimer(synchronize=lambda: events.append("sync"), clock=lambda: next(ticks))
    assert timer.time_call(lambda: events.append("call")) == 0.25
    assert events == ["sync", "call", "sync"]


def test_rotation_spans_twice_the_cache() -> None:
    assert timing.rotation_count(10e6, 50e6) == 10
    assert timing.rotation_count(200e6, 50e6) == 1
    assert timing.rotation_count(1.0, 50e6, max_sets=64) == 64
    with pytest.raises(ValueError):
        timing.summarize([])


def test_csv_round_trip_and_schema_errors(tmp_path) -> None:
    rows = [
        {"op": "gemm", "precision": "bf16", "m": 16, "n": 4096, "k": 4096, "batch": 1, "latency_s": 1.5e-5, "device": "X"},
        {"op": "attention_prefill", "precision": "bf16", "batch": 2, "seq_len": 128, "kv_len": 256, "heads": 8,
         "kv_heads": 2, "head_dim": 64, "causal": True, "latency_s": 2e-5},
        {"op": "all_reduce", "precision": "fp16", "num_gpus": 8, "message_bytes": 1 << 20, "latency_s": 3e-5},
    ]
    path = tmp_path / "m.csv"
    assert schema.write_csv(rows, path) == 3
    frame = schema.read_csv(path)
    assert list(frame.columns) == list(schema.COLUMNS)
    assert frame["m"].iloc[0] == 16 and frame["kv_len"].iloc[1] == 256 and bool(frame["causal"].iloc[1])
    assert frame["latency_s"].tolist() == [1.5e-5, 2e-5, 3e-5]
    with pytest.raises(schema.MeasurementError, match="op = 'gemv'"):
        schema.write_csv([{"op": "gemv", "latency_s": 1.0}], tmp_path / "bad.csv")
    with pytest.raises(schema.MeasurementError, match="latency_s"):
        schema.write_csv([{"op": "gemm", "latency_s": -1.0}], tmp_path / "bad.csv")
    (tmp_path / "noop.csv").write_text("op,latency_s\nfoo,1\n")
    with pytest.raises(schema.MeasurementError, match="'foo' unknown"):
        schema.read_csv(tmp_path / "noop.csv")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="PyTorch not installed (the calibrate extra; PyPI only has the multi-GB CUDA build, so CI runs without it)")
def test_harness_runs_on_cpu(tmp_path, capsys) -> None:
    out = tmp_path / "cpu.csv"
    assert main(["calibrate", "run", "--device", "cpu", "--out", str(out)]) == 0
    frame = schema.read_csv(out)
    ops = set(frame["op"])
    assert {"gemm", "attention_prefill", "attention_decode", "memory", "device_copy", "launch"} <= ops
    assert (frame["latency_s"] > 0).all() and frame["torch"].notna().all() and frame["date"].notna().all()
    prefill = frame[frame["op"] == "attention_prefill"]
    assert (prefill["kv_len"] > prefill["seq_len"]).any() and (prefill["kv_len"] == prefill["seq_len"]).any()
    assert set(frame[frame["op"] == "gemm"]["precision"]) == {"fp32", "bf16"}
    assert "wrote" in capsys.readouterr().out


def test_harness_without_cuda_says_so(capsys) -> None:
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is visible")
    assert main(["calibrate", "run", "--out", "/nonexistent/x.csv"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and ("PyTorch" in err or "--device cpu" in err)
