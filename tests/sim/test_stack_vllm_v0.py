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


def _cost(gpu: str = "a100-sxm-80gb", model: str = "llama2-70b", tp: int = 8, **serving):  # type: ignore[no-untyped-def]
    from sim.config import resolve_cluster, resolve_model
    from sim.serving.run import build_system

    config = {"model": {"name": model}, "cluster": {"gpu": gpu, "num_gpus": tp}}
    spec = parse_serving({"framework": V0, "tp": tp, **serving})
    return build_system(spec, resolve_model(config), resolve_cluster(config)).pools[0].cost


def test_custom_all_reduce_up_to_8_mib_and_nccl_past_it() -> None:
    # vLLM 0.5.3 should_custom_ar: inp_size <= max_size (8 MiB); Llama-2-70B's all-reduce is 8,192 x 2 B per
    # token, so 512 tokens (8 MiB) take the measured vLLM kernel and 513 the measured NCCL all-reduce
    from hardware.calibration import load_profile, shipped_profile_path
    from hardware.collectives import COLLECTIVE_LAUNCH_OVERHEAD_S, Collective, collective_time_s

    assert get_stack("serving", V0).settings["custom_all_reduce_max_bytes"] == 8 * 1024 * 1024
    profile = load_profile(shipped_profile_path("a100-sxm-80gb"))
    custom, nccl = profile.custom_all_reduce[("vllm", 8)], profile.collectives[("all_reduce", 8)]
    links = _cost()._links["tp"]
    at_limit, past = 512 * 8192 * 2, 513 * 8192 * 2
    assert collective_time_s(Collective.ALL_REDUCE, at_limit, links) == pytest.approx(
        custom.at(at_limit) + COLLECTIVE_LAUNCH_OVERHEAD_S, rel=1e-12)
    assert collective_time_s(Collective.ALL_REDUCE, past, links) == pytest.approx(
        nccl.at(past) + COLLECTIVE_LAUNCH_OVERHEAD_S, rel=1e-12)
    # a 4,096-token prefill (64 MiB) pays NCCL's 616.5 us, not the custom kernel's 594.2 us measured there
    assert collective_time_s(Collective.ALL_REDUCE, 2**26, links) == pytest.approx(616.5e-6 + 30e-6, rel=1e-9)
    unlimited = _cost(custom_all_reduce_max_bytes=0.0)._links["tp"]
    assert collective_time_s(Collective.ALL_REDUCE, 2**26, unlimited) == pytest.approx(594.19e-6 + 30e-6, rel=1e-9)


def test_cuda_graph_batch_sizes_of_vllm_v0() -> None:
    from sim.serving.stepcost import cuda_graph_batch

    padded = {b: cuda_graph_batch("vllm-v0", b, 1024) for b in (1, 2, 3, 4, 5, 8, 9, 17, 250, 256)}
    assert padded == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 17: 24, 250: 256, 256: 256}
    assert cuda_graph_batch("vllm-v0", 257, 1024) is None  # past the largest captured graph: eager
    assert cuda_graph_batch("vllm-v0", 8, 8193) is None  # past max_seq_len_to_capture: eager
    assert cuda_graph_batch("vllm-v0", 8, 8192) == 8
    assert cuda_graph_batch("none", 3, 10) is None
    with pytest.raises(ValueError, match="allowed: none, vllm-v0"):
        cuda_graph_batch("always", 3, 10)


def test_decode_only_steps_run_at_the_padded_batch_and_prefill_steps_do_not() -> None:
    from sim.serving.plan import Chunk, StepPlan
    from sim.serving.request import SimRequest

    cost = _cost()
    requests = [SimRequest(i, 0.0, 100, 10, ()) for i in range(5)]
    decode = StepPlan(chunks=tuple(Chunk(r, 1, 100, True) for r in requests[:3]))
    host = 2100e-6 + 3 * 89.5e-6
    expected = cost.token_time_s(4) + cost.attention_time_s([(1, 101)] * 3) + cost.head_time_s(3) + host
    assert cost.step_time_s(decode) == pytest.approx(expected, rel=1e-12)
    assert cost.token_time_s(4) > cost.token_time_s(3)
    prefill = StepPlan(chunks=tuple(Chunk(r, 3, 0, False) for r in requests[3:4]))
    assert cost.step_time_s(prefill) == pytest.approx(
        cost.token_time_s(3) + cost.attention_time_s([(3, 3)]) + cost.head_time_s(1) + 2100e-6 + 89.5e-6, rel=1e-12)
    eager = _cost(cuda_graph_padding="none")
    assert eager.step_time_s(decode) == pytest.approx(expected - cost.token_time_s(4) + cost.token_time_s(3), rel=1e-12)


def test_bad_cuda_graph_and_all_reduce_limit_values_are_one_line_errors(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from tests.test_cli_bad_input import serving_error

    for key, value, allowed in (("cuda_graph_padding", '"always"', "allowed: none, vllm-v0"),
                                ("custom_all_reduce_max_bytes", "-1", "must be a number >= 0"),
                                ("api_server", "\"yes\"", "must be true or false")):
        err = serving_error(capsys, tmp_path, f'framework = "vllm-0.5"\n{key} = {value}', model="llama2-7b",
                            gpu="a100-sxm-80gb")
        assert key in err and allowed in err

def test_api_server_cost_per_streamed_token_follows_the_cited_profile() -> None:
    # the vLLM v0.6.0 blog's profile of the 0.5.3-era server: HTTP API server 33 % vs the engine's host work
    # 29 %, scaled from the profile's per-sequence host cost
    profile = get_stack("serving", V0)
    source = profile.sources["api_server_token_overhead_us"]
    assert "33 %" in source and "29 %" in source and "PR #6883" in source
    assert profile.settings["api_server_token_overhead_us"] == pytest.approx(89.5 * 33 / 29, abs=0.05)
    assert get_stack("serving", "vllm").settings["api_server_token_overhead_us"] == 0.0  # V1: own process
    assert not parse_serving({"framework": V0}).api_server  # offline unless the config says so


def test_api_server_tokens_are_paid_serially_per_streamed_token() -> None:
    # two requests, 3 output tokens each, through the server: the prefill step streams both first tokens,
    # each decode step streams two more, 3 steps x 2 tokens x 101.8 us on top of the offline run
    offline, served = _run(), _run(api_server=True)
    assert served["pools"][0]["steps"] == offline["pools"][0]["steps"] == [3]
    assert served["duration_s"] - offline["duration_s"] == pytest.approx(6 * 101.8e-6, rel=1e-9)
    v1 = {"model": {"name": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
          "workload": {"arrival": "offline", "num_requests": 2, "prompt_tokens": 64, "output_tokens": 3}}
    assert (simulate({**v1, "serving": {"api_server": True}}, RunOptions()).metrics()["duration_s"]
            == simulate({**v1, "serving": {}}, RunOptions()).metrics()["duration_s"])  # V1's server runs in its own process


def test_a_prefill_chunk_that_does_not_finish_its_prompt_streams_nothing() -> None:
    from sim.serving.plan import Chunk, StepPlan
    from sim.serving.request import SimRequest
    from sim.serving.stepcost import streamed_tokens

    a, b, c = (SimRequest(i, 0.0, 100, 10, ()) for i in range(3))
    plan = StepPlan(chunks=(Chunk(a, 60, 0, False), Chunk(b, 40, 60, False), Chunk(c, 1, 100, True)))
    assert streamed_tokens(plan) == 2  # b completes its prompt, c decodes; a is mid-prompt
    cost, served = _cost(), _cost(api_server=True)
    assert served.step_time_s(plan) - cost.step_time_s(plan) == pytest.approx(2 * 101.8e-6, rel=1e-9)
    assert served.host_time_s(plan) - cost.host_time_s(plan) == pytest.approx(2 * 101.8e-6, rel=1e-9)
