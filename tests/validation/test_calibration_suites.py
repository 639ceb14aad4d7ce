"""The shipped calibration profiles against the analytic defaults on the published-results suites,
and the mechanisms that keep them from making a suite worse: ``[cluster] calibration = "none"``, a
serving stack's own tensor-parallel all-reduce (``tp_all_reduce``), imported and fitted from the
aiconfigurator custom all-reduce tables."""

from __future__ import annotations

import functools
from hardware.calibration import CalibrationProfile, Curve, load_profile, profile_toml, shipped_profile_path
from sim.config import resolve_cluster
from sim.stacks import get_stack
import pytest

from validation.published import SuiteReport


def test_calibration_none_prices_with_the_analytic_defaults() -> None:
    shipped = resolve_cluster({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}}).gpu
    analytic = resolve_cluster({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8, "calibration": "none"}}).gpu
    assert shipped.calibration is not None and analytic.calibration is None


def _curve(points: dict[int, float]) -> Curve:
    return Curve(log2_x=tuple(float(x) for x in points), y=tuple(points.values()))


def test_tp_all_reduce_view_takes_the_faster_of_the_stack_kernel_and_nccl() -> None:
    nccl = _curve({10: 10e-6, 20: 40e-6, 26: 400e-6})
    custom = _curve({7: 3e-6, 10: 4e-6, 20: 80e-6, 26: 400e-6})
    profile = CalibrationProfile(gpu="a100-sxm-80gb", source="test", collectives={("all_reduce", 2): nccl},
                                 custom_all_reduce={("trtllm", 2): custom})
    view = profile.for_tp_all_reduce("trtllm")
    assert view.collective_s("all_reduce", 2, 2**10) == pytest.approx(4e-6)  # the custom kernel
    assert view.collective_s("all_reduce", 2, 2**20) == pytest.approx(40e-6)  # NCCL
    assert view.collective_s("all_reduce", 2, 2**7) == pytest.approx(3e-6)  # measured for the custom kernel only
    assert profile.collective_s("all_reduce", 2, 2**10) == pytest.approx(10e-6)  # the profile itself is unchanged
    assert profile.for_tp_all_reduce("vllm") is profile  # no curve of that framework
    assert view is profile.for_tp_all_reduce("trtllm")  # one view per framework
    again = load_profile_text(profile)
    assert again.custom_all_reduce[("trtllm", 2)].y == custom.y


def load_profile_text(profile: CalibrationProfile) -> CalibrationProfile:
    import tomllib

    from hardware.calibration import parse_profile

    return parse_profile(tomllib.loads(profile_toml(profile)), "test")


def test_serving_stacks_name_their_all_reduce_kernel() -> None:
    assert get_stack("serving", "trtllm-0.9").settings["tp_all_reduce"] == "trtllm"
    assert get_stack("serving", "vllm").settings["tp_all_reduce"] == "vllm"
    assert get_stack("serving", "fastertransformer").settings["tp_all_reduce"] == "nccl"
    # every shipped profile of an NVLink GPU carries the TensorRT-LLM and vLLM curves
    for gpu in ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb"):
        profile = load_profile(shipped_profile_path(gpu))
        assert {("trtllm", 2), ("trtllm", 8), ("vllm", 2), ("vllm", 8)} <= set(profile.custom_all_reduce)


def test_a_trtllm_replica_prices_its_tp_all_reduce_from_the_custom_kernel() -> None:
    from sim.runner import RunOptions, simulate

    def ttft(**serving) -> float:
        config = {
            "model": {"name": "llama2-70b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 4},
            "serving": {"framework": "trtllm-0.9", "tp": 4, "scheduler": "static", "max_num_seqs": 1,
                        "weight_precision": "fp16", "kv_precision": "fp16", **serving},
            "workload": {"arrival": "offline", "num_requests": 1, "prompt_tokens": 16, "output_tokens": 1},
        }
        return simulate(config, RunOptions()).metrics()["ttft_s"]["mean"]

    # 160 all-reduces of a 16-token activation (256 KiB): measured on A100 x4 ~9 us with TensorRT-LLM's
    # kernel, ~18 us with NCCL (aiconfigurator-core tables in the shipped profile)
    custom, nccl = ttft(), ttft(tp_all_reduce="nccl")
    assert 160 * 5e-6 < nccl - custom < 160 * 20e-6


# ---- the suites: shipped profiles vs the analytic defaults, same code -------------------------------


@functools.cache
def _serving(calibration: str | None) -> SuiteReport:
    from validation.serving_suite import run_serving_suite

    return run_serving_suite(calibration=calibration)


def _summaries(report: SuiteReport) -> dict[str, tuple[float, float]]:
    return {t.metric: (report.mape(t.metric), report.worst(t.metric)) for t in report.thresholds}


def test_shipped_profiles_do_not_make_the_serving_suite_worse() -> None:
    """Throughput MAPE and worst row, first-token-latency MAPE and worst row: with each GPU's shipped
    profile no worse than the analytic defaults (A100 FP16 TensorRT-LLM 0.9 and FasterTransformer rows)."""
    on, off = _summaries(_serving(None)), _summaries(_serving("none"))
    for metric, (mape_off, worst_off) in off.items():
        mape_on, worst_on = on[metric]
        assert mape_on <= mape_off + 1e-12, (metric, mape_on, mape_off)
        assert worst_on <= worst_off + 1e-12, (metric, worst_on, worst_off)
