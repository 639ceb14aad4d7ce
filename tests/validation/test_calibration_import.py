"""``llmsim calibrate import aiconfigurator``: a small aiconfigurator-core style system folder is
written here (Parquet, the package's column names and folder layout) and converted."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.cli import main
from validation.microbench.schema import read_csv

pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (dev and calibrate extras)")


def _write(root, relative: str, rows: list[dict]) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)


@pytest.fixture()
def system(tmp_path):
    root = tmp_path / "h100_sxm"
    prov = {"framework": "TRTLLM", "version": "1.3.0", "device": "NVIDIA H100 80GB HBM3", "kernel_source": "torch_flow"}
    _write(root, "gemm/trtllm/1.3.0/gemm_perf.parquet", [
        {**prov, "op_name": "gemm", "gemm_dtype": "bfloat16", "m": 16, "n": 4096, "k": 4096, "latency": 0.02},
        {**prov, "op_name": "gemm", "gemm_dtype": "fp8", "m": 4096, "n": 4096, "k": 4096, "latency": 0.15},
    ])
    attention = {**prov, "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "beam_width": 1,
                 "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}
    _write(root, "attention/trtllm/1.3.0/context_attention_perf.parquet", [
        {**attention, "op_name": "context_attention", "batch_size": 2, "isl": 1024, "step": 0, "window_size": 0, "latency": 0.1},
        {**attention, "op_name": "context_attention", "batch_size": 2, "isl": 1024, "step": 0, "window_size": 128, "latency": 0.05},
    ])
    _write(root, "attention/trtllm/1.3.0/generation_attention_perf.parquet", [
        {**attention, "op_name": "generation_attention", "batch_size": 64, "isl": 1, "step": 4095, "window_size": 0, "latency": 0.03},
    ])
    # an older NCCL table without the provenance columns (as h100_sxm/comm/nccl/2.23 ships)
    _write(root, "comm/nccl/2.23/nccl_perf.parquet", [
        {"nccl_dtype": "half", "num_gpus": 8, "message_size": 1 << 20, "kernel_source": "NCCL", "op_name": "all_reduce", "latency": 0.04},
        {"nccl_dtype": "int8", "num_gpus": 4, "message_size": 1 << 20, "kernel_source": "NCCL", "op_name": "alltoall", "latency": 0.03},
    ])
    _write(root, "moe/trtllm/1.3.0/moe_perf.parquet", [
        {**prov, "op_name": "moe", "moe_dtype": "bfloat16", "num_tokens": 128, "hidden_size": 4096, "inter_size": 14336,
         "topk": 2, "num_experts": 8, "moe_tp_size": 1, "moe_ep_size": 1, "distribution": "balanced", "latency": 0.5},
    ])
    return root


def test_import_converts_every_table(system, tmp_path, capsys) -> None:
    out = tmp_path / "m.csv"
    assert main(["calibrate", "import", "aiconfigurator", str(system), "--out", str(out)]) == 0
    assert "wrote 7 measurements" in capsys.readouterr().out
    frame = read_csv(out)
    by_op = {op: part.reset_index(drop=True) for op, part in frame.groupby("op")}
    gemm = by_op["gemm"]
    assert sorted(gemm["precision"]) == ["bf16", "fp8"]
    assert gemm.loc[gemm["m"] == 16, "latency_s"].item() == pytest.approx(2e-5)
    assert set(gemm["framework"]) == {"trtllm"} and set(gemm["kernel_source"]) == {"torch_flow"}
    assert set(frame["gpu"]) == {"h100-sxm-80gb"}
    prefill = by_op["attention_prefill"]
    assert len(prefill) == 1  # the sliding-window row is skipped
    assert (prefill["seq_len"].item(), prefill["kv_len"].item(), prefill["batch"].item()) == (1024, 1024, 2)
    decode = by_op["attention_decode"]
    assert (decode["seq_len"].item(), decode["kv_len"].item()) == (1, 4096)  # step cached tokens + the new one
    all_reduce, all_to_all = by_op["all_reduce"], by_op["all_to_all"]
    assert all_reduce["message_bytes"].item() == 2 << 20  # 2^20 halves
    assert all_to_all["message_bytes"].item() == 1 << 20  # 2^20 int8
    assert all_reduce["library_version"].item() == "2.23" and all_reduce["framework"].item() == "nccl"
    moe = by_op["moe"]
    assert (moe["m"].item(), moe["n"].item(), moe["k"].item(), moe["experts"].item(), moe["topk"].item()) == (128, 14336, 4096, 8, 2)
    assert moe["extra"].item() == "moe_tp=1;moe_ep=1;distribution=balanced"
    assert frame["source"].str.startswith("aiconfigurator-core:h100_sxm/").all()


def test_import_errors_are_one_line(tmp_path, capsys) -> None:
    assert main(["calibrate", "import", "aiconfigurator", str(tmp_path / "missing"), "--out", str(tmp_path / "m.csv")]) == 2
    assert capsys.readouterr().err.startswith("error: aiconfigurator folder")
    (tmp_path / "empty").mkdir()
    assert main(["calibrate", "import", "aiconfigurator", str(tmp_path / "empty"), "--out", str(tmp_path / "m.csv")]) == 2
    assert "has no tables" in capsys.readouterr().err


def test_fp8_gemm_rows_less_their_activation_quantization(system) -> None:
    from validation.calibration.aiconfigurator import import_system, without_activation_quantization
    from validation.microbench.schema import MeasurementError

    frame = import_system(system)
    with pytest.raises(MeasurementError, match="quantize/trtllm"):
        without_activation_quantization(frame, system, "trtllm")
    prov = {"framework": "TRTLLM", "version": "1.3.0", "device": "NVIDIA H100 80GB HBM3", "kernel_source": "torch_ops",
            "quant_dtype": "fp8", "m": 4096, "k": 4096}
    # the dynamic quantization is compute_scale (dynamic - static) + scale_matrix (static): 0.05 ms of 0.15
    _write(system, "quantize/trtllm/1.3.0/computescale_perf.parquet", [{**prov, "op_name": "compute_scale", "latency": 0.02}])
    _write(system, "quantize/trtllm/1.3.0/scale_matrix_perf.parquet", [{**prov, "op_name": "scale_matrix", "latency": 0.03}])
    out = without_activation_quantization(frame, system, "trtllm")
    fp8 = out[(out["op"] == "gemm") & (out["precision"] == "fp8")]
    assert fp8["latency_s"].tolist() == pytest.approx([0.10e-3])
    assert len(out) == len(frame)
    assert out[out["precision"] != "fp8"]["latency_s"].tolist() == frame[frame["precision"] != "fp8"]["latency_s"].tolist()
    # the import does it itself once the system has the quantize tables
    imported = import_system(system)
    assert imported[imported["precision"] == "fp8"]["latency_s"].tolist() == pytest.approx([0.10e-3])
    # a row the quantization dominates (GEMM under a quarter of the call) is dropped
    _write(system, "quantize/trtllm/1.3.0/scale_matrix_perf.parquet", [{**prov, "op_name": "scale_matrix", "latency": 0.12}])
    assert len(without_activation_quantization(frame, system, "trtllm")) == len(frame) - 1
