"""The vLLM 0.5.x (V0 engine) serving stack, `[serving] framework = "vllm-0.5"`: its host cost per step
and per sequence follows from the numbers its profile cites, it is paid serially with the GPU work
(V0's step loop does not overlap them), and chunked prefill is off unless the config turns it on."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sim.runner import RunOptions, simulate
from sim.serving.config import parse_serving
from sim.stacks import get_stack

V0 = "vllm-0.5"


def test_host_cost_per_step_and_per_sequence_follow_the_cited_measurements() -> None:
    profile = get_stack("serving", V0)
    # per step: the least-squares intercept of the A100 V0-loop phase sums the source quotes (ms, batches 8..64)
    quoted = [float(x) for x in re.search(r"64: ([0-9., ]+) ms", profile.sources["step_overhead_us"]).group(1)
              .rstrip(" ").split(", ")]
    assert quoted == [3.62, 5.37, 7.08, 8.25, 10.33, 12.24, 13.74, 14.63]
    slope_ms, intercept_ms = np.polyfit(np.arange(8, 65, 8), quoted, 1)
    assert intercept_ms == pytest.approx(2.1, abs=0.01) and slope_ms == pytest.approx(0.203, abs=0.001)
    assert profile.settings["step_overhead_us"] == 2100.0
    # per sequence: 20 ms between steps at 200 sequences (vLLM #6801), less the per-step part
    assert profile.settings["request_overhead_us"] == pytest.approx((20_000.0 - 2100.0) / 200)


def test_profile_turns_chunked_prefill_off_and_the_config_wins() -> None:
    v0 = parse_serving({"framework": V0})
    assert (v0.chunked_prefill, v0.tp_all_reduce, v0.kv_cache_memory, v0.decode_attention) == (
        False, "vllm", "total_fraction", "shared_kv")
    assert v0.step_overhead_s == pytest.approx(2100e-6) and v0.request_overhead_s == pytest.approx(89.5e-6)
    assert parse_serving({"framework": V0, "chunked_prefill": True}).chunked_prefill
    assert parse_serving({}).chunked_prefill  # V1, the default stack: chunked prefill on


def _run(**serving) -> dict:  # type: ignore[type-arg]
    config = {"model": {"name": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
              "serving": {"framework": V0, **serving},
              "workload": {"arrival": "offline", "num_requests": 2, "prompt_tokens": 64, "output_tokens": 3}}
    return simulate(config, RunOptions()).metrics()


def test_host_time_is_paid_serially_every_step() -> None:
    # two requests, 3 output tokens each, V0 without chunking: one prefill step of both prompts (its
    # first tokens), then two decode steps of both: 3 steps x (2,100 + 2 x 89.5) us of host time on top
    # of exactly the same GPU work
    with_host, without = _run(), _run(step_overhead_us=0.0, request_overhead_us=0.0)
    assert with_host["pools"][0]["steps"] == without["pools"][0]["steps"] == [3]
    assert with_host["duration_s"] - without["duration_s"] == pytest.approx(3 * (2100 + 2 * 89.5) * 1e-6, rel=1e-9)


def test_v0_is_slower_than_v1_at_a_large_batch() -> None:
    # the same 64-request offline run: V0 pays ~7.8 ms of host time per 64-sequence decode step, V1 0.38 ms
    config = {"model": {"name": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
              "workload": {"arrival": "offline", "num_requests": 64, "prompt_tokens": 128, "output_tokens": 32}}
    v0 = simulate({**config, "serving": {"framework": V0}}, RunOptions()).metrics()
    v1 = simulate({**config, "serving": {"framework": "vllm"}}, RunOptions()).metrics()
    assert v0["framework"] == V0 and v1["framework"] == "vllm"
    assert v0["output_tokens_per_s"] < 0.8 * v1["output_tokens_per_s"]


def test_without_chunked_prefill_the_token_budget_is_vllms_default_for_that_mode() -> None:
    from sim.serving.config import resolve_token_budget

    v0 = parse_serving({"framework": V0})
    assert resolve_token_budget(v0, {}, 4096).max_batched_tokens == 4096  # max(max_model_len, 2048)
    assert resolve_token_budget(v0, {}, 1024).max_batched_tokens == 2048
    short = parse_serving({"framework": V0, "max_model_len": 8192})
    assert resolve_token_budget(short, {"max_model_len": 8192}, 4096).max_batched_tokens == 8192
    given = parse_serving({"framework": V0, "max_batched_tokens": 512})
    assert resolve_token_budget(given, {"max_batched_tokens": 512}, 4096).max_batched_tokens == 512
    v1 = parse_serving({})
    assert resolve_token_budget(v1, {}, 4096).max_batched_tokens == 8192  # chunked: the chunked default


def test_held_out_vllm_0_5_4_throughput_on_h100() -> None:
    # Not used to size the profile: vLLM PR #7162 (alex-m, 2024-08-05) quotes main of that day (vLLM
    # 0.5.4, V0) on benchmarks/benchmark_throughput.py --model meta-llama/Meta-Llama-3.1-8B-Instruct
    # --input-len 512 --output-len 256 --num-prompts 1000 on 1 x H100: 19.48 requests/s, 14,962.18
    # tokens/s. Llama 3.1's 131,072-token context makes 0.5.x turn chunked prefill on with a 512-token
    # budget (EngineArgs.create_engine_config, max_model_len > 32K); llama3-8b has the same shapes.
    config = {"model": {"name": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
              "serving": {"framework": V0, "chunked_prefill": True, "max_batched_tokens": 512},
              "workload": {"arrival": "offline", "num_requests": 1000, "prompt_tokens": 512, "output_tokens": 256}}
    published = 14_962.18
    predicted = simulate(config, RunOptions()).metrics()["total_tokens_per_s"]
    assert abs(predicted / published - 1) <= 0.12  # -7.6 % today
    no_host = {**config, "serving": {**config["serving"], "step_overhead_us": 0.0, "request_overhead_us": 0.0}}
    assert simulate(no_host, RunOptions()).metrics()["total_tokens_per_s"] > 1.6 * published  # the GPU alone: +78 %
