"""The command-line contract of INTERFACE.md: help everywhere, catalog output, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim.cli import build_parser, main

SUBCOMMANDS = [
    ["catalog"],
    ["catalog", "gpus"],
    ["catalog", "nodes"],
    ["catalog", "networks"],
    ["catalog", "models"],
    ["catalog", "show"],
    ["simulate"],
    ["search"],
    ["validate"],
    ["calibrate"],
    ["calibrate", "run"],
    ["calibrate", "import"],
    ["calibrate", "fit"],
]


@pytest.mark.parametrize("command", [[]] + SUBCOMMANDS, ids=lambda c: " ".join(c) or "llmsim")
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: llmsim" in capsys.readouterr().out


def test_every_registered_subcommand_is_covered() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    assert set(commands) == {c[0] for c in SUBCOMMANDS}


@pytest.mark.parametrize("kind, key", [("gpus", "gpus"), ("nodes", "nodes"), ("networks", "networks"), ("models", "models")])
def test_catalog_json_lists(kind: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", kind, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == [key] and data[key]
    assert all(entry["source"] for entry in data[key])


def test_catalog_models_json_has_the_interface_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "models", "--format", "json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    llama = models["llama3-70b"]
    for field in ("total_parameters", "active_parameters", "layers", "hidden", "heads", "kv_heads", "source"):
        assert field in llama
    assert models["mixtral-8x7b"]["active_parameters"] < models["mixtral-8x7b"]["total_parameters"]


def test_catalog_gpus_json_is_in_si_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "gpus", "--format", "json"]) == 0
    gpus = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    h100 = gpus["h100-sxm-80gb"]
    assert h100["peak_flops_per_s"]["bf16"] == pytest.approx(989e12, rel=0.01)  # datasheet dense bf16
    assert h100["hbm_bandwidth_Bps"] == pytest.approx(3.35e12, rel=0.01)
    assert h100["sm_count"] == 132


@pytest.mark.parametrize("name, expected", [
    ("h100-sxm-80gb", "TFLOP/s"),
    ("dgx-h100", "GB/s"),
    ("ib-ndr-fat-tree", "us"),
    ("llama3-70b", "total_parameters"),
])
def test_catalog_show_tables_carry_units(name: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith("name") and expected in out


def test_catalog_show_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", "dgx-a100", "--format", "json"]) == 0
    node = json.loads(capsys.readouterr().out)
    assert node["gpus_per_node"] == 8 and node["gpu"] == "a100-sxm-80gb"


@pytest.mark.parametrize("argv, fragment", [
    (["catalog", "show", "h100-sxm"], "unknown catalog entry 'h100-sxm'; known:"),
    (["catalog", "laptops"], "invalid choice: 'laptops'"),
    (["simulate", "does-not-exist.toml"], "config file 'does-not-exist.toml' not found"),
    (["simulate", "x.toml", "--fidelity", "exact"], "invalid choice: 'exact'"),
    (["validate", "--suite", "everything"], "invalid choice: 'everything'"),
])
def test_bad_input_is_one_error_line_and_exit_2(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in captured.err


def test_python_dash_m_sim_is_the_same_command() -> None:
    result = subprocess.run([sys.executable, "-m", "sim", "catalog", "show", "t4", "--format", "json"], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout)["name"] == "t4"
