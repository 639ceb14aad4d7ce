"""What a new user meets on the command line (issue 12): no silent wrong answers, one-line errors or
warnings for keys that do not apply, output paths checked before simulating, strict JSON, a
run.json that records what ran. Every test goes through ``sim.cli.main`` (stderr and exit code)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sim.cli import main

SERVING = """
[model]
name = "llama3-8b"
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = {num_gpus}
[serving]
tp = {tp}
{extra_serving}
[workload]
arrival = "poisson"
rate_per_s = 4.0
num_requests = 12
prompt_tokens = {{ distribution = "uniform", min = 100, max = 400 }}
output_tokens = 8
seed = 3
[slo]
ttft_s = 2.0
"""

TRAINING = """
[model]
name = "llama3-8b"
[cluster]
gpu = "{gpu}"
num_gpus = 8
[training]
seq_len = 2048
global_batch = 16
{extra_training}
[parallel]
tp = 8
"""


def _write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def serving_config(tmp_path: Path, *, num_gpus: int = 8, tp: int = 1, extra_serving: str = "") -> Path:
    return _write(tmp_path, SERVING.format(num_gpus=num_gpus, tp=tp, extra_serving=extra_serving))


def training_config(tmp_path: Path, *, gpu: str = "h100-sxm-80gb", extra_training: str = "") -> Path:
    return _write(tmp_path, TRAINING.format(gpu=gpu, extra_training=extra_training))


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def analytic_metrics(capsys: pytest.CaptureFixture[str], config: Path, *sets: str) -> dict[str, Any]:
    """``llmsim simulate CONFIG --fidelity analytic --format json`` with each ``--set`` assignment: its metrics."""
    argv: list[Any] = ["simulate", config, "--fidelity", "analytic", "--format", "json"]
    for assignment in sets:
        argv += ["--set", assignment]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return json.loads(out)


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- serving replicas from num_gpus -------------------------------------------------------------------


def test_serving_derives_replicas_from_num_gpus_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = serving_config(tmp_path, num_gpus=8, tp=1)
    code, out, _ = run(capsys, "simulate", config, "--format", "json")
    metrics = json.loads(out)
    assert code == 0 and metrics["num_gpus"] == 8 and metrics["pools"][0]["replicas"] == 8
    code, out, _ = run(capsys, "simulate", config)
    assert "replicas 8 (from num_gpus / (tp x ep x pp))" in out.splitlines()[0]


def test_serving_num_gpus_the_replicas_cannot_use_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=12, tp=8))
    assert code == 2 and "num_gpus = 12 is not a multiple of the 8 GPUs of one replica" in one_error(err)
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=16, tp=8, extra_serving="replicas = 1"))
    assert code == 2 and "uses 8: set num_gpus = 8, or add replicas to use the other 8" in one_error(err)


# ---- --seed -------------------------------------------------------------------------------------------


def test_seed_on_the_command_line_wins_and_run_json_records_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = serving_config(tmp_path, num_gpus=1)
    outs = {}
    for seed in ("3", "11"):
        code, out, _ = run(capsys, "simulate", config, "--seed", seed, "--format", "json", "--out", tmp_path / seed)
        assert code == 0
        outs[seed] = json.loads(out)
        meta = json.loads((tmp_path / seed / "run.json").read_text())
        assert meta["seed"] == int(seed) and meta["config"]["workload"]["seed"] == int(seed)
    _, file_seed_out, _ = run(capsys, "simulate", config, "--format", "json")
    assert json.loads(file_seed_out) == outs["3"]  # the file says seed = 3
    assert outs["11"]["ttft_s"] != outs["3"]["ttft_s"]


def test_negative_seed_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1), "--seed", "-1")
    assert code == 2 and "--seed -1 must be >= 0" in one_error(err)


# ---- keys and options that do not apply ----------------------------------------------------------------


def test_set_on_a_section_the_kind_does_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", training_config(tmp_path), "--set", "workload.rate_per_s=3")
    assert code == 2 and "a training config has no [workload]" in one_error(err)
    code, _, err = run(capsys, "simulate", serving_config(tmp_path), "--set", "parallel.tp=2")
    assert code == 2 and "a serving config has no [parallel]" in one_error(err)


def test_section_in_the_file_that_does_not_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SERVING.format(num_gpus=1, tp=1, extra_serving="") + "[parallel]\ntp = 2\n"
    code, _, err = run(capsys, "simulate", _write(tmp_path, text))
    assert code == 2 and "[parallel] does not apply to a serving config" in one_error(err)


def test_search_section_is_read_only_by_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TRAINING.format(gpu="h100-sxm-80gb", extra_training="") + '[search]\ngoal = "training"\n'
    code, _, err = run(capsys, "simulate", _write(tmp_path, text), "--fidelity", "analytic")
    assert code == 0 and "warning: [search] is read only by `llmsim search`" in err
    code, _, err = run(capsys, "simulate", training_config(tmp_path), "--set", "search.goal=fleet")
    assert code == 2 and "[search] is read only by `llmsim search`" in one_error(err)


def test_unknown_key_through_set_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", training_config(tmp_path), "--set", "training.seq_length=4096")
    assert code == 2 and "unknown key 'seq_length'" in one_error(err)


def test_two_sweeps_and_trace_with_sweep_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = training_config(tmp_path)
    code, _, err = run(capsys, "simulate", config, "--sweep", "training.micro_batch=1,2", "--sweep", "parallel.tp=1,2")
    assert code == 2 and "--sweep given 2 times" in one_error(err)
    code, _, err = run(capsys, "simulate", config, "--sweep", "training.micro_batch=1,2", "--trace", tmp_path / "t.json")
    assert code == 2 and "cannot be combined with --sweep" in one_error(err)
    assert not (tmp_path / "t.json").exists()


def test_fidelity_analytic_on_serving_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1), "--fidelity", "analytic")
    assert code == 0 and err.count("warning:") == 1 and "--fidelity analytic" in err


def test_verbose_prints_resolved_config_and_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", training_config(tmp_path), "--fidelity", "analytic", "-v", "--format", "json")
    json.loads(out)  # stdout stays one JSON object
    assert code == 0 and "resolved config:" in err and "dp=1" in err and "costliest ops of one layer" in err
    assert "cost sources (share of predicted op time): measured" in err
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1), "-v")
    assert code == 0 and "replica memory per GPU: budget" in err and "replicas=1" in err


def test_prompt_past_the_context_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1), "--set", "workload.prompt_tokens=20000")
    assert code == 2 and "workload.prompt_tokens = 20000 is longer than the 8192-token context" in one_error(err)
    code, _, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1),
                       "--set", "workload.output_tokens={distribution='uniform', min=10, max=9000}")
    assert code == 0 and "past the 8192-token context" in err


def test_seq_len_past_a_rope_models_context_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", training_config(tmp_path), "--set", "training.seq_len=16384", "--fidelity", "analytic")
    assert code == 0 and "warning: training.seq_len 16384 is past the 8192-token context" in err


# ---- memory ----------------------------------------------------------------------------------------------


def test_serving_with_no_room_for_kv_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", serving_config(tmp_path, num_gpus=1), "--set", "model.name=llama3-70b")
    assert code == 2 and out == ""
    # the budget is 0.9 of the 79.11 GiB the CUDA runtime reports on an H100 SXM 80GB (NVML: 81,559 MiB),
    # not of the datasheet 80 GiB
    assert "weights need 131.42 GiB" in one_error(err) and "of the 71.20 GiB per GPU" in err
    assert "x 79.11 GiB of device memory" in err


def test_training_that_does_not_fit_leads_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", training_config(tmp_path), "--set", "model.name=llama3-70b", "--fidelity", "analytic")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("DOES NOT FIT: stage")
    assert all("(if it fitted)" in line for line in lines if line.startswith(("iteration time", "tokens/s", "MFU")))


# ---- precision ----------------------------------------------------------------------------------------------


def test_precision_the_gpu_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TRAINING.format(gpu="t4", extra_training='precision = "bf16"').replace("num_gpus = 8", "num_gpus = 8\nnode = \"pcie-1x-t4\"")
    code, _, err = run(capsys, "simulate", _write(tmp_path, text), "--set", "parallel.tp=1", "--set", "cluster.num_gpus=1",
                       "--set", "model.name=gpt3-1.7b", "--set", "training.global_batch=1")
    assert code == 2
    assert "training.precision = 'bf16': gpu t4 has no bf16 peak (it has fp32, fp16, int8, int4); use training.precision = 'fp16'" in one_error(err)


def test_default_precision_the_gpu_lacks_is_replaced_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SERVING.format(num_gpus=1, tp=1, extra_serving="").replace('gpu = "h100-sxm-80gb"', 'gpu = "v100-sxm-32gb"')
    code, out, err = run(capsys, "simulate", _write(tmp_path, text), "--format", "json", "--out", tmp_path / "o")
    assert code == 0 and "serving.weight_precision defaults to bf16" in err and "using fp16" in err
    assert json.loads(out)["completed"] == 12
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    assert meta["config"]["serving"]["weight_precision"] == "fp16" and meta["warnings"]


# ---- output paths ------------------------------------------------------------------------------------------------


def test_out_that_is_a_file_fails_before_simulating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    code, out, err = run(capsys, "simulate", training_config(tmp_path), "--out", blocker)
    assert code == 2 and out == "" and "--out" in one_error(err) and "is not a folder" in err
    code, out, err = run(capsys, "simulate", training_config(tmp_path), "--out", blocker / "sub")
    assert code == 2 and out == "" and "cannot be created" in one_error(err)


def test_trace_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = training_config(tmp_path)
    code, out, err = run(capsys, "simulate", config, "--trace", tmp_path)
    assert code == 2 and out == "" and "is a folder" in one_error(err)
    code, _, _ = run(capsys, "simulate", config, "--trace", tmp_path / "new" / "deeper" / "t.json")
    assert code == 0 and json.loads((tmp_path / "new" / "deeper" / "t.json").read_text())["traceEvents"]
    code, _, _ = run(capsys, "simulate", config, "--out", tmp_path / "o", "--trace")
    assert code == 0 and (tmp_path / "o" / "trace.json").exists() and "config" in json.loads((tmp_path / "o" / "run.json").read_text())
    code, _, err = run(capsys, "simulate", config, "--out", tmp_path / "o", "--trace", tmp_path / "o" / "run.json")
    assert code == 2 and "would overwrite the run.json" in one_error(err)


def test_run_json_holds_the_resolved_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "simulate", training_config(tmp_path), "--fidelity", "analytic", "--out", tmp_path / "o")
    config = json.loads((tmp_path / "o" / "run.json").read_text())["config"]
    assert code == 0
    assert config["parallel"]["dp"] == 1 and config["parallel"]["schedule"] == "1f1b" and config["parallel"]["zero"] == 0
    assert config["training"]["micro_batch"] == 1 and config["training"]["precision"] == "bf16"
    assert config["cluster"]["node"] == "dgx-h100" and config["cluster"]["network"]


# ---- strict JSON -------------------------------------------------------------------------------------------------


def _finite_everywhere(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_everywhere(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite_everywhere(v) for v in value)
    return True


def test_json_output_is_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", training_config(tmp_path), "--fidelity", "analytic", "--format", "json")
    data = json.loads(out, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    assert code == 0 and _finite_everywhere(data)


def test_fsdp_units_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    # examples/train-llama3-8b-fsdp.toml (ZeRO-3 on 8 H100, megatron-core): per-layer units let each pass
    # start once the first unit is in, so the run is faster than one gather per chunk, in both fidelities
    example = Path(__file__).parent.parent / "examples" / "train-llama3-8b-fsdp.toml"

    def seconds(unit: str, fidelity: str) -> float:
        code = main(["simulate", str(example), "--format", "json", "--fidelity", fidelity,
                     "--set", f"training.fsdp_unit={unit}"])
        out = capsys.readouterr().out
        assert code == 0
        return json.loads(out)["iteration_time_s"]

    for fidelity in ("analytic", "des"):
        assert seconds("layer", fidelity) < seconds("chunk", fidelity)
    assert seconds("layer", "analytic") == pytest.approx(seconds("layer", "des"), rel=0.01)


def test_interface_md_s_hsdp_size_and_hyphenated_all_gather_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``hsdp = N`` and ``cp_comm = "all-gather"`` as INTERFACE.md writes them, from the CLI: a shard
    group of 16 ranks is not the in-node one (2 ranks at tp 4), 0 is no HSDP; the hyphen is the
    underscore's exchange."""
    config = _write(tmp_path, """
[model]
name = "llama3-70b"
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = 256
[training]
seq_len = 4096
global_batch = 256
[parallel]
tp = 4
zero = 3
recompute = "full"
""")

    def metrics(*sets: str) -> dict[str, Any]:
        return analytic_metrics(capsys, config, *sets)

    def seconds(*sets: str) -> float:
        return metrics(*sets)["iteration_time_s"]

    off, node, sixteen = seconds("parallel.hsdp=0"), seconds("parallel.hsdp=true"), seconds("parallel.hsdp=16")
    assert seconds("parallel.hsdp=false") == off and seconds("parallel.hsdp=2") == node
    assert len({off, node, sixteen}) == 3
    # the step of this plan is its FSDP stream's, so the exchanges differ in their exposed cp time
    hyphen = metrics("parallel.cp=2", 'parallel.cp_comm="all-gather"')
    assert hyphen == metrics("parallel.cp=2", 'parallel.cp_comm="all_gather"')
    assert hyphen["exposed_communication_s"]["cp"] != metrics("parallel.cp=2")["exposed_communication_s"]["cp"]


@pytest.mark.parametrize(("name", "overrides"), [
    ("train-llama3-8b-fsdp", []),
    ("train-llama3-8b-fsdp", ['training.framework="torchtitan"', "training.compile=true", "parallel.hsdp=4"]),
    ("train-llama3-8b-fsdp", ['training.framework="megatron-2021"', "parallel.hsdp=true"]),
    ("train-llama3-8b-fsdp", ['training.framework="torchtitan"', "training.compile=true", 'training.precision="fp8"',
                              'parallel.recompute="full"']),
    ("train-fp8-h100", []),
    ("train-hetero-a100-h100", []),
    ("train-hybrid-cp", []),
    ("train-schedule-file", []),
    ("llama3-70b-h100-serving", []),
    ("serve-disaggregated-h100", []),
    ("serve-azure-conv-trace-a100", []),
])
def test_the_resolved_config_reruns_to_the_same_prediction(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          name: str, overrides: list[str]) -> None:
    # run.json's config is the config as run (every default, the stack's settings included, the files it
    # names resolved against the config's folder): fed back to `llmsim simulate` from elsewhere, it gives
    # the same metrics
    from sim.toml_writer import dumps

    example = Path(__file__).parent.parent / "examples" / f"{name}.toml"
    sets = [arg for o in overrides for arg in ("--set", o)]
    fidelity = ["--fidelity", "analytic"] if name.startswith("train") else []
    code, _, _ = run(capsys, "simulate", example, *fidelity, "--out", tmp_path / "o", *sets)
    first = json.loads((tmp_path / "o" / "run.json").read_text())
    assert code == 0
    rerun = tmp_path / "rerun.toml"
    rerun.write_text(dumps(first["config"]))
    code, _, err = run(capsys, "simulate", rerun, *fidelity, "--out", tmp_path / "again")
    assert code == 0, err
    again = json.loads((tmp_path / "again" / "run.json").read_text())
    assert again["config"] == first["config"]

    def metrics(folder: str) -> dict[str, Any]:
        return json.loads((tmp_path / folder / "metrics.json").read_text())

    assert metrics("again") == metrics("o")


def test_fsdp_kept_units_gathered_inputs_and_loss_settings_run_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fsdp_kept_after_forward``, ``tp_gathered_input`` and ``cross_entropy = "xentropy"`` from the CLI: each
    moves the number it models on a torchtitan FSDP x TP plan, and a bad value is one error line, exit 2."""
    config = _write(tmp_path, """
[model]
name = "llama3-8b"
[cluster]
gpu = "h100-sxm-80gb"
num_gpus = 16
[training]
seq_len = 4096
global_batch = 16
framework = "torchtitan"
[parallel]
tp = 2
zero = 3
sequence_parallel = true
""")

    def metrics(*sets: str) -> dict[str, Any]:
        return analytic_metrics(capsys, config, *sets)

    default = metrics()
    assert default == metrics('training.fsdp_kept_after_forward="root_last_layer"', 'training.tp_gathered_input="save"')
    # the root unit and last block gathered again before every backward: no faster
    assert metrics('training.fsdp_kept_after_forward="none"')["iteration_time_s"] > default["iteration_time_s"]
    # the shard kept instead of the gathered inputs: less held
    assert metrics('training.tp_gathered_input="regather"')["peak_memory_bytes"] < default["peak_memory_bytes"]
    # flash-attention's xentropy holds 4 B per logit at its peak where torch's fp32 loss holds 12
    assert metrics('training.cross_entropy="xentropy"')["peak_memory_bytes"] < default["peak_memory_bytes"]
    for key, value in (("fsdp_kept_after_forward", "all"), ("tp_gathered_input", "keep"), ("cross_entropy", "fused")):
        code, out, err = run(capsys, "simulate", config, "--set", f'training.{key}="{value}"')
        assert code == 2 and out == ""
        assert err.strip().splitlines() == [err.strip()] and err.startswith(f"error: [training] {key} = '{value}'")
