"""Refit the calibration profiles that ship in ``hardware/calibration_profiles`` from the tables of
aiconfigurator-core (PyPI, Apache-2.0; ``pip download aiconfigurator-core --no-deps`` and unzip):

    python -m validation.calibration.ship .../aiconfigurator_core/systems/data

One profile per system with a catalog GPU (``aiconfigurator.SYSTEM_GPUS``) and tables, fitted on
every row of the TensorRT-LLM stack where the system has one (else the largest stack per op) plus
the NCCL tables. GEMM surfaces are bf16 everywhere, and fp8 on the Hopper systems
(``FP8_GEMM_SYSTEMS``): the tables' fp8 rows time TensorRT-LLM's Linear with its dynamic per-tensor
activation quantization (H100: 2048x4096x4096 fp8 runs at 1.12x the bf16 speed, 8192^3 at 1.59x),
which llmsim's training prices as separate cast ops and TensorRT-LLM's engines fuse into the norm
before the GEMM, so the fp8 surface is fitted on the GEMM alone: each row less the same
quantization op timed at its (m, k) in the package's quantize tables
(``aiconfigurator.without_activation_quantization``, applied by ``import_system``; 8192^3 then runs
at 1.98x the bf16 speed).
Those GEMMs run cuBLAS with fast accumulation (TensorRT-LLM tests/unittest/_torch/thop/
test_scaled_mm.py: cublas_scaled_mm equals torch._scaled_mm(use_fast_accum=True)), the analytic
fp8 rate the surface is fitted against (``hardware.cost.gemm_time_s``).

The Hopper GEMM tables ran at the boost clock (``BOOST_CLOCK_GEMM_SYSTEMS``): the collector
(ai-dynamo/aiconfigurator collector/trtllm/collect_gemm.py with collector/helper.py
benchmark_with_power) times each shape in one short burst, 3 warm-up calls, a CUDA graph of 1-5
copies, 3 warm-up replays and 6 timed replays, between Python set-up of the next shape (new weights,
a new Linear module, graph capture), so the board idles between shapes and stays under its power
limit. Its own rows show it: the measured / analytic (boost-clock MAMF) ratio of the bf16 rows with
m, n, k >= 1024 has a median of 1.00-1.01 for kernels up to 0.5 ms and falls with kernel duration
to 0.92 (H100) and 0.87-0.88 (H200) for kernels of 16 ms and more, whose bursts run 0.2-0.5 s, as a
700 W board's clock falls under sustained load. Their ratios are fitted at the boost clock
(``fit_profile(gemm_clock="boost")``), so predictions price these GEMMs at the catalog sustained
clock (``hardware.cost.sustained_clock_factor``). The A100 tables keep the sustained-clock fit
their profile shipped with.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hardware.calibration import SHIPPED_DIR, profile_toml
from hardware.catalog import analytic_gpu
from validation.calibration.aiconfigurator import SYSTEM_GPUS, import_system
from validation.calibration.fit import fit_profile

PACKAGE = "aiconfigurator-core 0.12.0 (PyPI, Apache-2.0)"
SHIPPED_GEMM_PRECISIONS = ("bf16",)
# Systems whose fp8 GEMM rows ship, as the GEMM kernel alone (see the module docstring): Hopper, where
# the quantize tables were checked against the GEMM tables (subtracted, H100 and H200 8192^3 both run
# 1,510-1,553 TFLOP/s). Elsewhere fp8 keeps the analytic model.
FP8_GEMM_SYSTEMS = ("h100_sxm", "h200_sxm")
# Systems whose GEMM tables ran at the boost clock (see the module docstring): their ratios are
# fitted against the analytic model without the sustained clock factor.
BOOST_CLOCK_GEMM_SYSTEMS = ("h100_sxm", "h200_sxm")


def ship(data_dir: Path, out_dir: Path = SHIPPED_DIR) -> list[Path]:
    written = []
    for system, gpu in sorted(SYSTEM_GPUS.items()):
        folder = data_dir / system
        if not (folder / "gemm").is_dir():
            continue
        frame = import_system(folder)
        frame = frame[frame["op"] != "moe"]
        framework = "trtllm" if (frame["framework"] == "trtllm").any() else None
        stack = framework or "largest per op"
        precisions = SHIPPED_GEMM_PRECISIONS
        if system in FP8_GEMM_SYSTEMS and framework is not None:  # import_system made them the GEMM alone
            precisions = (*precisions, "fp8")
        gemm_clock = "boost" if system in BOOST_CLOCK_GEMM_SYSTEMS else "sustained"
        profile = fit_profile(frame, analytic_gpu(gpu), framework=framework, gemm_precisions=precisions,
                              source=f"{PACKAGE} systems/data/{system}, stack {stack}", gemm_clock=gemm_clock)
        gemm_note = ("GEMM bf16, and fp8 less its activation quantization" if "fp8" in precisions
                     else "GEMM bf16 only")
        if gemm_clock == "boost":
            gemm_note += ", fitted at the boost clock the tables ran at"
        header = (
            f"Shipped calibration profile for {gpu}: `llmsim calibrate fit` on every row of the {PACKAGE}\n"
            f"tables of system {system} (stack {stack}, plus the NCCL tables); {gemm_note} (see\n"
            "validation/calibration/ship.py). Regenerate: python -m validation.calibration.ship .../systems/data"
        )
        path = out_dir / f"{gpu}.toml"
        path.write_text(profile_toml(profile, header=header))
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m validation.calibration.ship AICONFIGURATOR_SYSTEMS_DATA_DIR")
    for written_path in ship(Path(sys.argv[1])):
        print(f"wrote {written_path}")
