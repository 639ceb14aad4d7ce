"""Eager elementwise chains and the SDPA layout copies (workloads.eager), and what they do to a
torchtitan run end to end."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hardware.catalog import get_gpu
from sim import costmodel
from sim.cli import main
from sim.runner import RunOptions, simulate
from workloads import eager
from workloads.catalog import get_model
from workloads.graph import Sharding, backward_ops, layer_forward_ops

LLAMA = get_model("llama3-8b")  # RMSNorm, SwiGLU, RoPE, 32 heads over 8 KV heads
TOKENS = 4096


def _forward(model=LLAMA):  # type: ignore[no-untyped-def]
    return layer_forward_ops(model, tokens=TOKENS, sequences=((TOKENS, TOKENS),), sharding=Sharding(tp=1),
                             moe=False, bytes_per_element=2.0)


def _by_name(ops):  # type: ignore[no-untyped-def]
    return {op.name: op for op in ops}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="counts ATen ops with torch")
def test_constants_are_the_counted_aten_ops() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from eager_elementwise_bytes import counts

    counted = counts()

    def pair(name: str, direction: str) -> tuple[float, int]:
        values = counted[name]
        return values[f"{direction}_bytes"], values[f"{direction}_kernels"]

    # small per-row and per-token tables (rsqrt of a row, the RoPE frequencies) round away
    for name, forward, backward in (("rmsnorm", eager.RMSNORM_FORWARD, eager.RMSNORM_BACKWARD),
                                    ("rope", eager.ROPE_FORWARD, eager.ROPE_BACKWARD),
                                    ("swiglu", eager.SWIGLU_FORWARD, eager.SWIGLU_BACKWARD),
                                    ("residual", eager.RESIDUAL_FORWARD, eager.RESIDUAL_BACKWARD)):
        for direction, expected in (("forward", forward), ("backward", backward)):
            nbytes, kernels = pair(name, direction)
            assert kernels == expected[1], (name, direction)
            assert nbytes == pytest.approx(expected[0], abs=0.4), (name, direction)
    # repeat_kv at heads / kv_heads = 4: 2 + 2/4 bytes per repeated element each way, one kernel
    assert pair("repeat_kv", "forward") == pytest.approx((2.5, 1)) and pair("repeat_kv", "backward") == pytest.approx((2.5, 1))
    # the output copy's gradient is a view the SDPA backward reads: no kernel (workloads.graph.backward_ops
    # drops an op of no backward kernels)
    assert pair("attention_output", "forward") == pytest.approx((4.0, 1)) and pair("attention_output", "backward") == (0, 0)


def test_eager_rmsnorm_rope_swiglu_and_residual_bytes() -> None:
    fused, eager_ops = _by_name(_forward()), _by_name(eager.eager_elementwise_ops(_forward(), LLAMA, fused_norm=False))
    hidden = TOKENS * LLAMA.hidden
    assert eager_ops["input_norm"].bytes_moved == 36 * hidden == 9 * fused["input_norm"].bytes_moved
    assert eager_ops["input_norm"].kernels == 8 and eager_ops["input_norm"].backward_bytes_moved == 92 * hidden
    assert eager_ops["residual_norm"].bytes_moved == (6 + 36) * hidden and eager_ops["residual_norm"].kernels == 9
    qk = TOKENS * (LLAMA.heads + LLAMA.kv_heads) * LLAMA.head_dim
    assert eager_ops["rope"].bytes_moved == 20 * qk and eager_ops["rope"].kernels == 6
    assert eager_ops["mlp_activation"].bytes_moved == 10 * TOKENS * LLAMA.ffn_hidden
    # GEMMs and attention untouched
    assert {n: op for n, op in eager_ops.items() if op.kind != "memory"} == {n: op for n, op in fused.items() if op.kind != "memory"}
    # in backward each residual connection sums the skip path's gradient with the branch's (one kernel)
    b_ops, _ = backward_ops(list(eager_ops.values()))
    names = _by_name(b_ops)
    assert names["residual_backward"].kernels == 1 and names["residual_backward"].bytes_moved == 6 * hidden
    assert names["residual_norm_backward"].kernels == 17


def test_fused_norm_keeps_one_norm_kernel_and_layernorm_models_keep_theirs() -> None:
    ops = _by_name(eager.eager_elementwise_ops(_forward(), LLAMA, fused_norm=True))
    assert ops["input_norm"].bytes_moved == 4 * TOKENS * LLAMA.hidden and ops["input_norm"].kernels == 1
    assert ops["residual_norm"].kernels == 2  # the add, then the fused norm
    gpt = get_model("gpt3-1.7b")  # LayerNorm, GeLU: one ATen kernel each, as fused
    fused, eager_ops = _by_name(_forward(gpt)), _by_name(eager.eager_elementwise_ops(_forward(gpt), gpt, fused_norm=False))
    assert eager_ops["input_norm"] == fused["input_norm"] and eager_ops["mlp_activation"] == fused["mlp_activation"]


def test_sdpa_copies_repeat_kv_only_under_gqa() -> None:
    ops = eager.sdpa_layout_ops(_forward())
    names = [op.name for op in ops]
    assert names.index("repeat_kv") + 1 == names.index("attention") and names.index("attention_output_copy") == names.index("attention") + 1
    by = _by_name(ops)
    repeated = TOKENS * LLAMA.heads * 2 * LLAMA.head_dim  # K and V at the query heads
    assert by["repeat_kv"].bytes_moved == 2.0 * repeated * (1 + LLAMA.kv_heads / LLAMA.heads)
    assert by["attention"].kv_heads == LLAMA.heads
    assert by["attention_output_copy"].bytes_moved == 4.0 * TOKENS * LLAMA.heads * LLAMA.head_dim
    mha = get_model("llama2-13b")
    assert "repeat_kv" not in [op.name for op in eager.sdpa_layout_ops(_forward(mha))]


def test_a_kernel_chain_pays_a_launch_per_kernel() -> None:
    gpu = get_gpu("h100-sxm-80gb")
    op = _by_name(_forward())["input_norm"]
    one = costmodel.op_time_s(op, gpu, precision="bf16", links={})
    eight = costmodel.op_time_s(replace(op, kernels=8), gpu, precision="bf16", links={})
    assert eight == pytest.approx(8 * costmodel.op_time_s(replace(op, bytes_moved=op.bytes_moved / 8), gpu, precision="bf16", links={}))
    assert eight > one


def _titan(num_gpus: int = 8, **training):  # type: ignore[no-untyped-def]
    return {"model": {"name": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": num_gpus},
            "training": {"seq_len": 8192, "global_batch": 2 * num_gpus, "micro_batch": 2, "framework": "torchtitan",
                         **training},
            "parallel": {"zero": 3, "recompute": "selective"}}


@pytest.mark.parametrize(("num_gpus", "eager_tps", "compiled_tps"), [(8, 5762, 6667), (128, 5605, 6514)])
def test_compile_speedup_of_torchtitan_llama3_8b_against_the_published_pair(num_gpus: int, eager_tps: int,
                                                                              compiled_tps: int) -> None:
    # published-training.md A12 (torchtitan benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3):
    # Llama 3.1 8B, FSDP on 8 and 128 H100 (96 GB HBM2e, 500 W), local batch 2, per-op SAC, tokens/s per
    # GPU eager and with torch.compile (1.157x, 1.162x). The catalog's 80 GB H100 SXM stands in (the
    # 500 W part has no catalog entry: its clock is not published); the pair's ratio is held to 4 %
    # (predicted 1.200 and 1.202; 1.169 and 1.171 with memory-bound kernels at the STREAM rate: the
    # catalog's 0.807 of it is one mean over kernels measured at 0.70-0.93 of it).
    def seconds(**training) -> float:  # type: ignore[no-untyped-def]
        return simulate(_titan(num_gpus, **training), RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]

    eager_s, compiled_s = seconds(), seconds(compile=True)
    assert eager_s / compiled_s == pytest.approx(compiled_tps / eager_tps, rel=0.04)
    # compile = true is elementwise = "fused"; eager with torchtitan's fused_rmsnorm lies between
    assert seconds(elementwise="fused") == compiled_s
    assert compiled_s < seconds(elementwise="eager_fused_norm") < eager_s


def test_compile_with_eager_elementwise_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[model]\nname = "llama3-8b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 8\n'
                    '[training]\nseq_len = 8192\nglobal_batch = 16\nmicro_batch = 2\nframework = "torchtitan"\n'
                    'compile = true\nelementwise = "eager"\n[parallel]\nzero = 3\n')
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: [training] compile = true with elementwise = 'eager'")
    path.write_text(path.read_text().replace('elementwise = "eager"', 'elementwise = "eagre"'))
    assert main(["simulate", str(path)]) == 2
    assert "allowed: fused, eager, eager_fused_norm" in capsys.readouterr().err


def test_saved_activations_of_an_eager_norm_and_of_sdpa_repeated_kv() -> None:
    from sim.training.activations import activation_bytes_per_layer
    from workloads.plan import ParallelPlan, TrainingJob

    plan = ParallelPlan(tp=1, pp=1, dp=8, recompute="none")
    job = TrainingJob(seq_len=TOKENS, global_batch=8, micro_batch=1)

    def stored(**settings) -> float:  # type: ignore[no-untyped-def]
        return activation_bytes_per_layer(LLAMA, plan, replace(job, **settings), dropout=False)

    # an eager RMSNorm keeps its fp32 input and 16-bit output (6 B) where a fused one keeps its input (2 B)
    assert stored(elementwise="eager") - stored() == 2 * (6 - 2) * TOKENS * LLAMA.hidden
    assert stored(elementwise="eager_fused_norm") == stored()
    # SDPA keeps K and V repeated from 8 to 32 heads
    assert stored(attention_layout="torch_sdpa") - stored() == 2 * 2 * TOKENS * (LLAMA.heads - LLAMA.kv_heads) * LLAMA.head_dim


@pytest.mark.parametrize("model", ["llama3-8b", "gpt3-1.7b", "mixtral-8x7b"])
@pytest.mark.parametrize("parallel", [{"zero": 3, "recompute": "none"},
                                      {"tp": 2, "pp": 2, "sequence_parallel": True, "zero": 1, "recompute": "full"}])
def test_eager_chains_are_never_faster_than_fused_ones(model: str, parallel: dict) -> None:  # type: ignore[type-arg]
    # more bytes and more kernels, never less time, in both fidelities; a LayerNorm model with a non-gated
    # MLP (GPT-3) only pays the split of its residual adds from its norms
    def seconds(elementwise: str, fidelity: str) -> float:
        config = {"model": {"name": model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8},
                  "training": {"seq_len": 2048, "global_batch": 16, "framework": "torchtitan", "elementwise": elementwise},
                  "parallel": parallel}
        return simulate(config, RunOptions(fidelity=fidelity)).metrics()["iteration_time_s"]

    for fidelity in ("analytic", "des"):
        fused, fused_norm, eager_s = (seconds(e, fidelity) for e in ("fused", "eager_fused_norm", "eager"))
        assert fused <= fused_norm * (1 + 1e-12) and fused_norm <= eager_s * (1 + 1e-12)
        if get_model(model).norm != "rmsnorm":  # eager LayerNorm is one kernel, as fused
            assert eager_s == pytest.approx(fused_norm, rel=1e-12)
        if model == "llama3-8b":  # RMSNorm, RoPE and SwiGLU eager: a few per cent of the step
            assert eager_s > 1.03 * fused
