"""Refit the calibration profiles that ship in ``hardware/calibration_profiles`` from the tables of
aiconfigurator-core (PyPI, Apache-2.0; ``pip download aiconfigurator-core --no-deps`` and unzip):

    python -m validation.calibration.ship .../aiconfigurator_core/systems/data

One profile per system with a catalog GPU (``aiconfigurator.SYSTEM_GPUS``) and tables, fitted on
every row of the TensorRT-LLM stack where the system has one (else the largest stack per op) plus
the NCCL tables. GEMM surfaces are bf16 only: the tables' fp8 rows time the serving path with
per-tensor activation quantization (H100 trtllm: 2048x4096x4096 fp8 runs at 1.12x the bf16 speed,
8192^3 at 1.59x), which llmsim's training prices as separate cast ops, so fp8 GEMMs keep the
analytic model in the shipped profiles (``llmsim calibrate fit`` fits fp8 when asked).
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
        profile = fit_profile(frame, analytic_gpu(gpu), framework=framework, gemm_precisions=SHIPPED_GEMM_PRECISIONS,
                              source=f"{PACKAGE} systems/data/{system}, stack {stack}")
        header = (
            f"Shipped calibration profile for {gpu}: `llmsim calibrate fit` on every row of the {PACKAGE}\n"
            f"tables of system {system} (stack {stack}, plus the NCCL tables); GEMM bf16 only (see\n"
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
