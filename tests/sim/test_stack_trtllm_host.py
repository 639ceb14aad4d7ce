"""The TensorRT-LLM 0.14 serving stack's host work per iteration, `[serving] framework = "trtllm"`: the
size its profile cites (NVIDIA/TensorRT-LLM PR #10018: the TensorRT backend executor's decode step
1.24 ms without overlap, 0.97 ms with it), paid serially with the GPU work every step, and nothing
per sequence (no public source sizes it)."""

from __future__ import annotations

import re

import pytest

from sim.runner import RunOptions, simulate
from sim.serving.config import parse_serving
from sim.stacks import get_stack


def test_step_overhead_is_the_cited_step_latency_difference() -> None:
    profile = get_stack("serving", "trtllm")
    source = profile.sources["step_overhead_us"]
    without, with_overlap = (float(x) for x in re.search(r"from ([0-9.]+) to ([0-9.]+) ms", source).groups())
    assert (without, with_overlap) == (1.24, 0.97)
    assert profile.settings["step_overhead_us"] == pytest.approx((without - with_overlap) * 1e3, abs=1e-9)
    assert profile.settings["request_overhead_us"] == 0.0
    spec = parse_serving({"framework": "trtllm"})
    assert spec.step_overhead_s == pytest.approx(270e-6) and spec.request_overhead_s == 0.0
    # the 0.9 runtime's profile (GptSession, static batches) is a different executor and keeps its own value
    assert parse_serving({"framework": "trtllm-0.9"}).step_overhead_s == 0.0


def _run(**serving) -> dict:  # type: ignore[type-arg]
    config = {"model": {"name": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
              "serving": {"framework": "trtllm", "scheduler": "inflight", "chunked_prefill": True,
                          "max_num_seqs": 8, "max_batched_tokens": 2048, "max_model_len": 256, **serving},
              "workload": {"arrival": "offline", "num_requests": 4, "prompt_tokens": 128, "output_tokens": 5}}
    return simulate(config, RunOptions()).metrics()


def test_host_time_is_paid_serially_once_per_step() -> None:
    # four 128-token prompts fit one step's 2,048-token budget (their first tokens), then four decode
    # steps of all four: 5 steps, each 270 us longer than the same GPU work without host time
    with_host, without = _run(), _run(step_overhead_us=0.0)
    assert with_host["pools"][0]["steps"] == without["pools"][0]["steps"] == [5]
    assert with_host["duration_s"] - without["duration_s"] == pytest.approx(5 * 270e-6, rel=1e-9)
