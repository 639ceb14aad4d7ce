"""Every training example runs through the CLI, obeys the physics, matches its golden file, and
the features it exercises move the metrics the way they must.

Goldens live in tests/golden/<example>.json, one per examples/*.toml with a [training] section,
holding the flattened JSON metrics of both fidelities. After an intended change to the simulator,
rewrite them with ``python tests/test_examples_training.py --regenerate`` and review the diff.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":
    # Run as a script, sys.path[0] is tests/, whose sim/ test folder would shadow the sim package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
# The DES of every example is cheap (one rank per pipeline stage by symmetry; the largest, the 1T
# model on 3,072 GPUs, takes about 1 s), so both fidelities run for all of them.
FIDELITIES = ("analytic", "des")
REGENERATE = "python tests/test_examples_training.py --regenerate"
# Goldens hold outputs of deterministic float arithmetic: rel 1e-6 absorbs summation-order noise
# only. Quantities that are zero in the golden may carry round-off (the DES reports 1e-15 s of
# data-parallel time with dp = 1), hence the absolute floor, far below any metric's resolution.
GOLDEN_REL = 1e-6
GOLDEN_ABS = 1e-9


def training_examples() -> list[Path]:
    """examples/*.toml that hold a [training] section (and are not plan searches), sorted by name."""
    paths = []
    for path in sorted(EXAMPLES.glob("*.toml")):
        with path.open("rb") as handle:
            config = tomllib.load(handle)
        if "training" in config and "search" not in config:
            paths.append(path)
    return paths


def _cli_json(args: list[str]) -> dict[str, Any]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(args)
    if code != 0:
        raise AssertionError(f"llmsim {' '.join(args)} exited {code}")
    return json.loads(buffer.getvalue())


@lru_cache(maxsize=None)
def _simulate_text(path: str, fidelity: str, overrides: tuple[str, ...]) -> str:
    args = ["simulate", path, "--format", "json", "--fidelity", fidelity]
    for override in overrides:
        args += ["--set", override]
    return json.dumps(_cli_json(args))


def simulate(path: Path, fidelity: str, *overrides: str) -> dict[str, Any]:
    """The CLI's JSON metrics of one run (cached; each call gets its own copy)."""
    return json.loads(_simulate_text(str(path), fidelity, overrides))


@lru_cache(maxsize=None)
def gpu_capacity_bytes(gpu: str) -> float:
    return float(_cli_json(["catalog", "show", gpu, "--format", "json"])["hbm_capacity_bytes"])


def _config(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float | bool | str]:
    """Nested metrics -> {"a.b": leaf}; numbers, booleans and strings only."""
    flat: dict[str, float | bool | str] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
    return flat


def golden_path(example: Path) -> Path:
    return GOLDEN / f"{example.stem}.json"


def golden_record(example: Path) -> dict[str, Any]:
    record: dict[str, Any] = {
        "example": example.relative_to(ROOT).as_posix(),
        "command": f"llmsim simulate {example.relative_to(ROOT).as_posix()} --format json --fidelity FIDELITY",
        "regenerate": REGENERATE,
    }
    for fidelity in FIDELITIES:
        record[fidelity] = flatten(simulate(example, fidelity))
    return record


def regenerate() -> list[Path]:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    written = []
    for example in training_examples():
        path = golden_path(example)
        path.write_text(json.dumps(golden_record(example), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


EXAMPLE_PATHS = training_examples()
EXAMPLE_IDS = [p.stem for p in EXAMPLE_PATHS]


def test_there_are_training_examples() -> None:
    names = {p.stem for p in EXAMPLE_PATHS}
    assert "gpt3-175b-a100" in names
    assert sum(name.startswith("train-") for name in names) >= 8


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("example", EXAMPLE_PATHS, ids=EXAMPLE_IDS)
def test_example_physical_invariants(example: Path, fidelity: str) -> None:
    m = simulate(example, fidelity)
    config = _config(example)
    assert m["fidelity"] == fidelity
    assert m["iteration_time_s"] > 0
    assert 0 < m["mfu"] <= m["hfu"] < 1
    assert 0 <= m["bubble_fraction"] < 1
    assert set(m["exposed_communication_s"]) == {"tp", "pp", "dp", "cp", "ep"}
    for axis, seconds in m["exposed_communication_s"].items():
        assert seconds >= 0, f"exposed {axis} communication {seconds} s is negative"
        assert seconds < m["iteration_time_s"]
    parallel = m["parallel"]
    gpus = parallel["tp"] * parallel["pp"] * parallel["cp"] * parallel["dp"]
    groups = config["cluster"].get("groups", [])
    assert gpus == (sum(g["num_gpus"] for g in groups) if groups else config["cluster"]["num_gpus"])
    tokens = config["training"]["global_batch"] * config["training"]["seq_len"]
    assert m["tokens_per_s"] == pytest.approx(tokens / m["iteration_time_s"], rel=1e-9)
    assert m["tokens_per_s_per_gpu"] * gpus == pytest.approx(m["tokens_per_s"], rel=1e-9)
    # memory: the parts sum to the peak; fits_in_memory and the shortfall follow from the capacity
    parts = m["memory_bytes"]
    assert all(value >= 0 for value in parts.values())
    assert sum(parts.values()) == pytest.approx(m["peak_memory_bytes"], rel=1e-9)
    if groups:  # every stage against its own group's GPU: the peak fits the largest of them if all fit
        capacity = max(gpu_capacity_bytes(g["gpu"]) for g in groups)
        assert m["peak_memory_bytes"] <= capacity or not m["fits_in_memory"]
        assert (m["memory_shortfall_bytes"] == 0.0) == m["fits_in_memory"]
    else:
        capacity = gpu_capacity_bytes(config["cluster"]["gpu"])
        assert m["fits_in_memory"] == (m["peak_memory_bytes"] <= capacity)
        assert m["memory_shortfall_bytes"] == pytest.approx(max(0.0, m["peak_memory_bytes"] - capacity), rel=1e-9)
    assert m["offloaded_bytes"]["cpu"] >= 0 and m["offloaded_bytes"]["nvme"] >= 0
    # one axis degree of 1 means no communication on it
    for axis in ("tp", "cp", "ep"):
        if parallel[axis] == 1:
            assert m["exposed_communication_s"][axis] == 0.0
    if parallel["pp"] == 1:
        # no pipeline: the analytic bubble is zero; the DES may idle only while waiting on
        # communication (e.g. FSDP parameter all-gathers), which the exposed times account for
        idle_s = m["bubble_fraction"] * m["iteration_time_s"]
        if fidelity == "analytic":
            assert m["bubble_fraction"] == 0.0
        else:
            assert idle_s <= sum(m["exposed_communication_s"].values()) * (1 + 1e-9)


@pytest.mark.parametrize("example", EXAMPLE_PATHS, ids=EXAMPLE_IDS)
def test_analytic_and_des_agree(example: Path) -> None:
    # The 1 % agreement of DESIGN.md holds only without overlap; these examples overlap TP, DP and
    # CP communication, which the DES executes and the closed form approximates. 5 % bounds the
    # spread seen across all examples (largest: the 405B long-context run, about 3 %). 6 % since
    # Megatron-Core's paced ZeRO-1 parameter gathers (param_gather_pacing "bucket"): that run
    # (interleaved, v 2) is 4.4 -> 5.4 % apart, the closed form not following the second chunk's
    # gather (bounded in tests/sim/test_training_zero1_pacing.py).
    analytic = simulate(example, "analytic")
    des = simulate(example, "des")
    assert des["iteration_time_s"] == pytest.approx(analytic["iteration_time_s"], rel=0.06)
    assert des["peak_memory_bytes"] == pytest.approx(analytic["peak_memory_bytes"], rel=1e-9)


@pytest.mark.parametrize("example", EXAMPLE_PATHS, ids=EXAMPLE_IDS)
def test_example_matches_golden(example: Path) -> None:
    path = golden_path(example)
    if not path.exists():
        pytest.fail(f"no golden file {path.relative_to(ROOT)}; write it with {REGENERATE}")
    golden = json.loads(path.read_text())
    for fidelity in FIDELITIES:
        actual = flatten(simulate(example, fidelity))
        for key, expected in golden[fidelity].items():
            assert key in actual, f"{example.name} ({fidelity}): metric {key} missing; {REGENERATE} if intended"
            value = actual[key]
            if isinstance(expected, (bool, str)):
                assert value == expected, f"{example.name} ({fidelity}) {key}: {value!r} != golden {expected!r}"
            else:
                assert value == pytest.approx(expected, rel=GOLDEN_REL, abs=GOLDEN_ABS), (
                    f"{example.name} ({fidelity}) {key}: {value!r} != golden {expected!r}; {REGENERATE} if intended"
                )


# ---- directions: each feature moves the metrics the way it must ----------------------------------


def _example(name: str) -> Path:
    return EXAMPLES / f"{name}.toml"


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_zero_bubble_h1_has_a_smaller_bubble_than_1f1b(fidelity: str) -> None:
    path = _example("train-zb-h1")
    zb = simulate(path, fidelity, "parallel.schedule=zb-h1")
    one_f_one_b = simulate(path, fidelity, "parallel.schedule=1f1b")
    assert zb["bubble_fraction"] < one_f_one_b["bubble_fraction"]
    assert zb["iteration_time_s"] < one_f_one_b["iteration_time_s"]
    # ZB-H1 keeps 1F1B's activation memory (Qi et al. 2024, arXiv 2401.10241, section 3: "same peak
    # memory"); GPipe keeps every micro-batch in flight, so it needs more
    gpipe = simulate(path, fidelity, "parallel.schedule=gpipe")
    assert zb["memory_bytes"]["activations"] == pytest.approx(one_f_one_b["memory_bytes"]["activations"], rel=1e-9)
    assert gpipe["memory_bytes"]["activations"] > one_f_one_b["memory_bytes"]["activations"]


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_hsdp_changes_data_parallel_communication_and_shards_inside_a_node(fidelity: str) -> None:
    path = _example("train-llama3-8b-fsdp")
    fsdp = simulate(path, fidelity, "parallel.hsdp=false")
    hsdp = simulate(path, fidelity, "parallel.hsdp=true")
    assert fsdp["exposed_communication_s"]["dp"] > 0
    assert hsdp["exposed_communication_s"]["dp"] != pytest.approx(fsdp["exposed_communication_s"]["dp"], rel=1e-3)
    # ZeRO 3 over 16 ranks vs HSDP sharding over the 8 GPUs of a node: twice the weight shard
    assert hsdp["memory_bytes"]["weights"] == pytest.approx(2 * fsdp["memory_bytes"]["weights"], rel=1e-9)


def test_optimizer_offload_moves_gradients_and_optimizer_states_to_the_cpu() -> None:
    path = _example("train-offload-1gpu")
    on_gpu = simulate(path, "analytic", "parallel.offload=none")
    offload = simulate(path, "analytic", "parallel.offload=optimizer")
    nvme = simulate(path, "analytic", "parallel.offload=nvme")
    # 13B with fp32 Adam does not fit in 32 GB without offload: reported, not rejected
    assert not on_gpu["fits_in_memory"] and on_gpu["memory_shortfall_bytes"] > 0
    assert on_gpu["offloaded_bytes"] == {"cpu": 0.0, "nvme": 0.0}
    # ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840): gradients and optimizer states live on the CPU
    assert offload["memory_bytes"]["optimizer"] == 0.0
    assert offload["memory_bytes"]["gradients"] == 0.0
    moved = on_gpu["memory_bytes"]["optimizer"] + on_gpu["memory_bytes"]["gradients"]
    assert offload["offloaded_bytes"]["cpu"] == pytest.approx(moved, rel=1e-9)
    assert offload["offloaded_bytes"]["nvme"] == 0.0
    assert offload["fits_in_memory"]
    # ZeRO-Infinity on NVMe: states leave the CPU for the SSD; the slower tier costs time
    assert nvme["offloaded_bytes"]["nvme"] > 0
    assert nvme["memory_bytes"]["optimizer"] == 0.0
    assert nvme["iteration_time_s"] > offload["iteration_time_s"] > on_gpu["iteration_time_s"]


def test_context_parallel_halves_activation_memory() -> None:
    # Same data-parallel degree (2) and micro-batch count: cp = 2 takes twice the GPUs.
    path = _example("train-llama3-70b-h100")
    cp1 = simulate(path, "analytic", "parallel.cp=1", "cluster.num_gpus=64")
    cp2 = simulate(path, "analytic", "parallel.cp=2", "cluster.num_gpus=128")
    assert cp1["parallel"]["dp"] == cp2["parallel"]["dp"] == 2
    ratio = cp2["memory_bytes"]["activations"] / cp1["memory_bytes"]["activations"]
    assert ratio == pytest.approx(0.5, rel=0.10)
    assert cp2["iteration_time_s"] < cp1["iteration_time_s"]


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_expert_parallel_adds_all_to_all_and_imbalance_slows_it(fidelity: str) -> None:
    path = _example("train-mixtral-8x7b-ep")
    ep1 = simulate(path, fidelity, "parallel.ep=1")
    ep8 = simulate(path, fidelity, "parallel.ep=8")
    assert ep1["exposed_communication_s"]["ep"] == 0.0
    assert ep8["exposed_communication_s"]["ep"] > 0
    # experts split 8 ways: far fewer weight bytes per GPU
    assert ep8["memory_bytes"]["weights"] < ep1["memory_bytes"]["weights"]
    balanced = simulate(path, fidelity, "parallel.ep=8", "parallel.expert_load_imbalance=1.0")
    assert ep8["iteration_time_s"] > balanced["iteration_time_s"]


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_the_flex_dispatcher_and_the_combined_1f1b_shrink_the_exposed_all_to_alls(fidelity: str) -> None:
    path = _example("train-qwen3-30b-a3b-ep16-flex-h100")
    flex = simulate(path, fidelity)
    alltoall = simulate(path, fidelity, "training.moe_dispatcher=alltoall")
    overlapped = simulate(path, fidelity, "parallel.ep_comm_overlap=true")
    # two nodes, top 8 of 128 experts: a quarter of the all-to-all's inter-node bytes
    assert flex["exposed_communication_s"]["ep"] < 0.4 * alltoall["exposed_communication_s"]["ep"]
    assert flex["iteration_time_s"] < alltoall["iteration_time_s"]
    assert overlapped["exposed_communication_s"]["ep"] < flex["exposed_communication_s"]["ep"]
    assert overlapped["iteration_time_s"] < flex["iteration_time_s"]
    # the combined 1F1B holds a second micro-batch's activations (no pipeline)
    assert overlapped["memory_bytes"]["activations"] == pytest.approx(2 * flex["memory_bytes"]["activations"], rel=1e-9)


def test_fp8_is_faster_than_bf16_and_mfu_uses_the_fp8_peak() -> None:
    path = _example("train-fp8-h100")
    fp8 = simulate(path, "analytic", "training.precision=fp8")
    bf16 = simulate(path, "analytic", "training.precision=bf16")
    assert fp8["iteration_time_s"] < bf16["iteration_time_s"]
    # model FLOPs are the same; only the peak in the MFU denominator doubles (H100 fp8 dense
    # 1,979 vs bf16 989 TFLOP/s), so fp8 MFU is below bf16 MFU while model FLOP/s are above
    assert fp8["model_flops_per_s_per_gpu"] > bf16["model_flops_per_s_per_gpu"]
    assert fp8["mfu"] < bf16["mfu"]


def test_long_context_needs_recompute_to_fit() -> None:
    path = _example("train-llama3.1-405b-cp")
    full = simulate(path, "analytic", "parallel.recompute=full")
    selective = simulate(path, "analytic", "parallel.recompute=selective")
    assert full["fits_in_memory"]
    assert not selective["fits_in_memory"] and selective["memory_shortfall_bytes"] > 0
    assert full["hfu"] > full["mfu"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        raise SystemExit(f"usage: {REGENERATE}")
    for written in regenerate():
        print(written.relative_to(ROOT))
