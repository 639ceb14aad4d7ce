"""``[training] dropout``: the bias-dropout-add mask traffic and the fused attention kernel's rate with
dropout (sim.training.costs.with_dropout), exact on a one-GPU layer; bad values are one error line."""

from __future__ import annotations

import dataclasses

import copy

import pytest

from hardware.catalog import get_gpu
from hardware.cost import attention_time_s, launch_overhead_s, memory_op_time_s
from sim.cli import main
from sim.config import with_overrides
from sim.training.config import parse_training
from sim.training.costs import (
    ATTENTION_DROPOUT_EXTRA_MS, ATTENTION_DROPOUT_KERNEL_MS, ATTENTION_DROPOUT_RATE, HIDDEN_DROPOUT_BACKWARD_EXTRA_BYTES, HIDDEN_DROPOUT_FORWARD_BYTES, HIDDEN_DROPOUT_SITES,
    layer_passes,
)

BASE = {
    "model": {"name": "gpt3-1.7b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 2},
    "training": {"seq_len": 2048, "global_batch": 4, "micro_batch": 2, "precision": "bf16"},
    "parallel": {"tp": 2, "pp": 1, "sequence_parallel": True, "recompute": "selective"},
}


def _config(**overrides: object) -> dict:
    return with_overrides(copy.deepcopy(BASE), [f"{k}={v}" for k, v in overrides.items()])


def _ops(config: dict) -> dict[str, object]:
    setup = parse_training(config)
    f, b, w = layer_passes(setup, False)
    return {op.name: op for op in (*f, *b, *w)}


def test_dropout_adds_the_mask_bytes_and_slows_only_the_attention_kernel() -> None:
    off, on = _ops(_config()), _ops(_config(**{"training.dropout": 0.1}))
    assert off.keys() == on.keys()  # no new kernels: the mask rides on the residual adds
    setup = parse_training(_config())
    elements = 2 * 2048 // 2 * setup.model.hidden  # micro-batch x sequence / tp (sequence parallel) x hidden
    for site in HIDDEN_DROPOUT_SITES:
        assert on[site].bytes_moved - off[site].bytes_moved == HIDDEN_DROPOUT_FORWARD_BYTES * elements
        backward = on[f"{site}_backward"].bytes_moved - off[f"{site}_backward"].bytes_moved
        assert backward == (2 * 2.0 + HIDDEN_DROPOUT_BACKWARD_EXTRA_BYTES) * elements  # bf16 gradient read + written, mask read
    for name in ("attention", "attention_backward", "recompute_attention"):
        assert on[name].kernel_rate == pytest.approx(off[name].kernel_rate * ATTENTION_DROPOUT_RATE, rel=1e-15)
    changed = {name for name in on if on[name] != off[name]}
    assert changed == {*HIDDEN_DROPOUT_SITES, *(f"{s}_backward" for s in HIDDEN_DROPOUT_SITES),
                       "attention", "attention_backward", "recompute_attention"}
    # priced: the memory ops by their bytes, so the extra seconds are those of the extra bytes
    gpu = setup.cluster.gpu
    site = on["residual"]
    assert memory_op_time_s(gpu, site.bytes_moved) > memory_op_time_s(gpu, off["residual"].bytes_moved)


def test_attention_dropout_rate_is_te3312s_extra_time_over_the_models_kernel_time() -> None:
    # NVIDIA/TransformerEngine#3312, H200 sbhd: 0.594 -> 0.614 ms with attention_dropout 0.1, 4 x 1,024
    # tokens, 16 heads, head dim 128, bf16, TE's default causal mask, cuDNN fused attention; 50 timed calls
    # after 20 warm-up, short ones between which the GPU idles: priced at the boost clock they ran at
    gpu = dataclasses.replace(get_gpu("h200-sxm-141gb"), sustained_clock_Hz=None)
    shape = dict(heads=16, kv_heads=16, head_dim=128, precision="bf16", bytes_per_element=2.0, causal=True, kernel="cudnn")
    kernel_s = sum(attention_time_s(gpu, [(1024, 1024)] * 4, backward=b, **shape) - launch_overhead_s(gpu) for b in (False, True))
    assert kernel_s * 1e3 == pytest.approx(ATTENTION_DROPOUT_KERNEL_MS, abs=5e-5)
    assert kernel_s / 0.594e-3 == pytest.approx(0.366, abs=1e-3)  # the wall time is mostly not the kernels
    assert ATTENTION_DROPOUT_EXTRA_MS == pytest.approx(0.020, abs=1e-12)
    assert ATTENTION_DROPOUT_RATE == pytest.approx(0.2177 / 0.2377, rel=1e-12)
    assert ATTENTION_DROPOUT_RATE == pytest.approx(0.9159, abs=5e-5)
    assert ATTENTION_DROPOUT_RATE < 0.594 / 0.614  # the wall-time ratio under-prices the kernel's dropout


def test_only_whether_dropout_is_on_changes_the_time() -> None:
    from sim.runner import RunOptions
    from sim.training.run import simulate_training

    def seconds(p: float) -> float:
        return simulate_training(_config(**{"training.dropout": p}), RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]

    assert seconds(0.1) == seconds(0.5) > seconds(0.0)


@pytest.mark.parametrize("value", ["1.0", "-0.1", "true", '"x"'])
def test_bad_dropout_is_one_error_line(tmp_path, capsys, value) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.toml"
    path.write_text(
        '[model]\nname = "gpt3-1.7b"\n[cluster]\ngpu = "h100-sxm-80gb"\nnum_gpus = 1\n'
        f"[training]\nseq_len = 2048\nglobal_batch = 2\ndropout = {value}\n"
    )
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "training.dropout" in err[0] and "[0, 1)" in err[0]
