"""What a serving engine's KV cache starts from: the CUDA runtime's total (not NVML's), less the
memory its process holds outside its own allocations (``runtime_reserve_MiB``) and, for TensorRT-LLM,
its runtime and decoder buffers for every max_batch_size slot (``decoder_buffers = "trtllm"``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardware.catalog import get_gpu, get_network, get_node
from hardware.topology import build_cluster
from hardware.units import GiB, MiB
from sim.cli import main
from sim.serving.capacity import NCCL_BUFFER_BYTES, replica_memory, trtllm_slot_buffer_bytes, workspace_bytes_per_gpu
from sim.serving.config import parse_serving
from sim.serving.stepcost import ReplicaShape
from sim.stacks import get_stack
from workloads.catalog import get_model

from tests.test_cli_bad_input import serving_error


def _shape(tp: int, model: str = "llama3-70b") -> ReplicaShape:
    gpu = get_gpu("h100-sxm-80gb")
    node = get_node(gpu.default_node)
    return ReplicaShape(model=get_model(model), cluster=build_cluster(gpu, node, get_network(node.default_network), tp),
                        tp=tp, weight_precision="bf16", kv_precision="bf16", activation_precision="bf16")


def test_trtllm_slot_buffers_reproduce_the_logged_runtime_and_decoder_lines() -> None:
    # NVIDIA/TensorRT-LLM issue #1188 (late 2024): Qwen2.5-0.5B, vocab 151,936, max_seq_len 32,768, 2,048
    # slots: "Allocated 2.66 GB GPU memory for runtime buffers", "5.76 GB ... for decoder" (binary units)
    assert trtllm_slot_buffer_bytes(151_936, 32_768, 2048, 8192) / GiB == pytest.approx(2.66 + 5.76, abs=0.01)
    # docs/source/reference/memory.md (an earlier executor, whose decoder held one more fp32 B x V buffer,
    # its draft logits): vocab 32,000, 32 pages of 64 tokens, 256 slots: 43.29 + 180.30 MiB
    earlier = trtllm_slot_buffer_bytes(32_000, 2048, 256, 8192) + 256 * 32_000 * 4
    assert earlier / MiB == pytest.approx(43.29 + 180.30, abs=0.05)


def test_trtllm_workspace_holds_the_slot_buffers_over_the_whole_vocabulary() -> None:
    # 70B at TP 8, 896 slots of 2,000 tokens: every rank holds the full 128,256-entry vocabulary's buffers
    shape = _shape(8)
    activations = workspace_bytes_per_gpu(shape, 2048, 0)
    trt = workspace_bytes_per_gpu(shape, 2048, 896, decoder_buffers="trtllm", max_seq_len=2000)
    assert trt - activations == trtllm_slot_buffer_bytes(128_256, 2000, 896, 2048)
    # 896 x (20 x 128,256 + 40 x 2,000 + 65,776) + 4 x 2,048 B
    assert trt - activations == 2_428_971_008
    # five times the one fp32 logits buffer the "logits" rule counts, plus the per-position and per-slot terms
    assert trt > workspace_bytes_per_gpu(shape, 2048, 896, gathered_logits=True) + 4 * 896 * 128_256 * 4
    with pytest.raises(ValueError, match="decoder_buffers"):
        workspace_bytes_per_gpu(shape, 2048, 896, decoder_buffers="vllm")


def test_trtllm_kv_budget_is_the_fraction_of_what_the_engine_leaves() -> None:
    shape = _shape(8)
    memory = replica_memory(shape, gpu_memory_utilization=0.9, block_size=64, max_batched_tokens=2048, max_num_seqs=896,
                            kv_cache_memory="free_fraction", runtime_reserve_bytes=791 * MiB, decoder_buffers="trtllm",
                            max_seq_len=2000)
    held = memory.weights_bytes + memory.workspace_bytes + NCCL_BUFFER_BYTES + 791 * MiB
    assert memory.kv_bytes == pytest.approx(0.9 * (79.11 * GiB - held))
    assert memory.runtime_bytes == 791 * MiB and memory.num_blocks == int(memory.kv_bytes // (64 * 40_960))


def test_engine_memory_settings_come_from_the_stack_and_a_user_key_wins() -> None:
    settings = {name: get_stack("serving", name).settings for name in ("trtllm", "trtllm-0.9", "fastertransformer", "vllm", "vllm-0.5")}
    assert {n: (s["runtime_reserve_MiB"], s["decoder_buffers"]) for n, s in settings.items()} == {
        "trtllm": (791.0, "trtllm"), "trtllm-0.9": (791.0, "logits"), "fastertransformer": (791.0, "logits"),
        "vllm": (0.0, "logits"), "vllm-0.5": (0.0, "logits"),
    }
    trt = parse_serving({"framework": "trtllm"})
    assert (trt.runtime_reserve_bytes, trt.decoder_buffers) == (791 * MiB, "trtllm")
    user = parse_serving({"framework": "trtllm", "runtime_reserve_MiB": 0, "decoder_buffers": "logits"})
    assert (user.runtime_reserve_bytes, user.decoder_buffers) == (0.0, "logits")


def test_simulate_reports_the_reserve_with_the_other_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('[model]\nname = "llama3-8b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 1\n'
                    '[serving]\nframework = "trtllm"\nmax_num_seqs = 256\nmax_batched_tokens = 2048\nmax_model_len = 2000\n'
                    '[workload]\narrival = "offline"\nnum_requests = 4\nprompt_tokens = 64\noutput_tokens = 4\n')
    assert main(["simulate", str(path), "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["pools"][0]["memory_bytes"]
    # one GPU: no NCCL buffers, so "other" is the 791 MiB the process holds outside its allocations
    assert memory["other"] == 791 * MiB
    expected = workspace_bytes_per_gpu(_shape(1, "llama3-8b"), 2048, 256, decoder_buffers="trtllm", max_seq_len=2000)
    assert memory["activations"] == pytest.approx(expected)


@pytest.mark.parametrize("line,words", [
    ("runtime_reserve_MiB = -1", ("runtime_reserve_MiB", ">= 0")),
    ('decoder_buffers = "vllm"', ("decoder_buffers", "logits, trtllm")),
])
def test_bad_engine_memory_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                                 words: tuple[str, ...]) -> None:
    err = serving_error(capsys, tmp_path, f'framework = "trtllm"\n{line}')
    assert all(w in err for w in words), err
