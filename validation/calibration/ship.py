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
        profile = fit_profile(frame, analytic_gpu(gpu), framework=framework, gemm_precisions=precisions,
                              source=f"{PACKAGE} systems/data/{system}, stack {stack}")
        gemm_note = ("GEMM bf16, and fp8 less its activation quantization" if "fp8" in precisions
                     else "GEMM bf16 only")
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
