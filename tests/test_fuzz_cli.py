"""A seeded fuzzer over the config space, run through the CLI in-process (issue 12).

Mutated copies of the examples (wrong types, zero / negative / NaN / inf / huge numbers, empty
strings, unknown and missing keys, extreme parallel degrees, tiny and huge lengths and rates, missing
and malformed trace files, malformed TOML) must end in exit 0 with strict, finite JSON and no
negative time, or exit 2 with one ``error:`` line that names the field; never a traceback, never a
hang. The sample is fixed (``random.Random(SEED)``), so a failure reproduces; run this file as a
script for a larger sample: ``python tests/test_fuzz_cli.py 2000``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import random
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.cli import main  # noqa: E402

SEED = 12
SAMPLE = 160  # cases in the CI test (~20 s on one core)
CASE_TIMEOUT_S = 30  # a case slower than this counts as a hang
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))

WEIRD_VALUES: list[Any] = [
    0, -1, -(2**40), 2**40, 2**63 - 1, 10**9, 1e300, -1e300, float("nan"), float("inf"), float("-inf"),
    0.0, 1e-300, 0.5, "", "abc", "auto", True, False, [], [1, 2], {}, {"distribution": "zipf"},
    {"distribution": "lognormal", "mu": 1e3, "sigma": 1}, {"distribution": "uniform", "min": 5, "max": 1},
    {"distribution": "empirical", "path": "no-such.csv", "column": "x"},
]
EXTRA_VALUES_BY_KEY: dict[str, list[Any]] = {
    "tp": [2, 3, 7, 1024], "pp": [2, 3, 1000], "dp": [3, 10**6], "cp": [2, 3], "ep": [2, 3, 64],
    "num_gpus": [1, 3, 7, 12, 10**7], "replicas": [2, 5], "micro_batch": [3, 10**6], "global_batch": [1, 7, 2**30],
    "seq_len": [1, 3, 10**6, 10**8], "rate_per_s": [1e-9, 1e9], "num_requests": [1, 2, 10**6],
    "prompt_tokens": [1, 10**5, 10**7], "output_tokens": [1, 2, 10**6], "trace": ["missing.csv", "data"],
    "schedule": ["zb-h1", "gpipe", "interleaved", "nope"], "virtual_stages": [2, 3], "zero": [1, 2, 3, 4],
    "gpu": ["t4", "v100-sxm-32gb", "mi300x", "nope"], "scheduler": ["static", "orca", "sarathi", "disaggregated"],
    "precision": ["fp8", "fp16", "int4"], "weight_precision": ["fp8", "int4", "fp32"], "offload": ["nvme", "x"],
    "recompute": ["full", "selective", "x"], "arrival": ["offline", "gamma", "trace", "x"],
}


def _cases(seed: int, count: int) -> Iterator[tuple[str, str, list[str]]]:
    """(case id, config text, extra argv) for ``count`` mutated examples."""
    rng = random.Random(seed)
    examples = [(path, tomllib.loads(path.read_text())) for path in EXAMPLES]
    for index in range(count):
        path, base = examples[rng.randrange(len(examples))]
        config = copy.deepcopy(base)
        if isinstance(config.get("workload", {}).get("num_requests"), int):
            config["workload"]["num_requests"] = min(config["workload"]["num_requests"], 40)  # keep CI fast
        label = []
        for _ in range(rng.choice((1, 1, 2))):
            label.append(_mutate(config, rng))
        if rng.random() < 0.04:
            text = _to_toml(config)[: rng.randrange(1, 200)] + "\n[[[ = broken"
            label.append("malformed-toml")
        else:
            text = _to_toml(config)
        is_training = "training" in config
        argv = ["--format", "json"]
        if is_training:
            argv += ["--fidelity", rng.choice(("analytic", "analytic", "des"))]
        yield f"{index}:{path.name}:{'+'.join(label)}", text, argv


def _mutate(config: dict[str, Any], rng: random.Random) -> str:
    sections = [name for name, table in config.items() if isinstance(table, dict)]
    name = rng.choice(sections)
    table = config[name]
    roll = rng.random()
    if roll < 0.08:
        table[f"bogus_{rng.randrange(100)}"] = 1
        return f"{name}.bogus"
    if roll < 0.14 and table:
        # (not num_requests: without it a trace replays all its ~20,000 rows, a long run, not a hang)
        key = rng.choice([k for k in table if k != "num_requests"] or list(table))
        del table[key]
        return f"{name}.{key}-removed"
    if roll < 0.17:
        config[f"section_{rng.randrange(10)}"] = {"x": 1}
        return "section-unknown"
    keys = [k for k, v in table.items() if not isinstance(v, dict)] or list(table) or ["x"]
    key = rng.choice(keys)
    current = table.get(key)
    if roll < 0.55 and isinstance(current, int | float) and not isinstance(current, bool):
        # a plausible neighbour: most of these still simulate, so the result checks get exercised
        factor = rng.choice((0.5, 2, 4, 0.125, 16))
        table[key] = max(1, int(current * factor)) if isinstance(current, int) else current * factor
        return f"{name}.{key}={table[key]!r}"
    pool = WEIRD_VALUES + EXTRA_VALUES_BY_KEY.get(key, []) * 3
    table[key] = copy.deepcopy(rng.choice(pool))
    return f"{name}.{key}={table[key]!r}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _to_toml(config: dict[str, Any], prefix: str = "") -> str:
    lines: list[str] = []
    scalars = {k: v for k, v in config.items() if not isinstance(v, dict) or (prefix and k in ("prompt_tokens", "output_tokens", "turns"))}
    tables = {k: v for k, v in config.items() if k not in scalars}
    if prefix:
        lines.append(f"[{prefix}]")
    for key, value in scalars.items():
        lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        lines.append(_to_toml(value, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines) + "\n"


class CaseTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def run_case(text: str, argv: list[str], folder: Path) -> tuple[int, str, str]:
    """Write the config beside the examples' data (so relative traces resolve) and run the CLI."""
    config = folder / "fuzz.toml"
    config.write_bytes(text.encode("utf-8"))
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["simulate", str(config), *argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def _times_ok(value: Any, path: str = "") -> list[str]:
    """Paths of non-finite numbers anywhere, and of negative numbers under a key naming a time."""
    bad: list[str] = []
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(path)
    elif isinstance(value, int | float) and not isinstance(value, bool) and value < 0 and (
            "_s" in path or "time" in path) and not path.endswith(".error"):  # a signed relative error may be < 0
        bad.append(path)
    elif isinstance(value, dict):
        for k, v in value.items():
            bad += _times_ok(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            bad += _times_ok(v, f"{path}[{i}]")
    return bad


def check(case: str, code: int, out: str, err: str) -> list[str]:
    """The properties every run must have; returns what is broken."""
    problems = []
    if "Traceback" in err:
        problems.append("traceback")
    if code == 0:
        try:
            data = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError as exc:
            return [f"stdout is not strict JSON: {exc}"]
        problems += [f"non-finite or negative time at {p}" for p in _times_ok(data)]
    elif code == 2:
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        if len(errors) != 1:
            problems.append(f"expected one error line, got {err!r}")
        elif not _names_a_field(errors[0]):
            problems.append(f"error names no field: {errors[0]}")
    else:
        problems.append(f"exit code {code}")
    return problems


def _names_a_field(line: str) -> bool:
    """An error names a field when it cites a section, a dotted key, an option or the file."""
    import re

    return bool(re.search(r"\[[a-z_.]+\]|[a-z_]+\.[a-z_]+|--[a-z]+|fuzz\.toml|'[a-z_0-9]+'|\b(model|gpu|node|network) ", line))


CODES: dict[int, int] = {}


def fuzz(seed: int, count: int, folder: Path) -> list[str]:
    failures = []
    for case, text, argv in _cases(seed, count):
        try:
            code, out, err = run_case(text, argv, folder)
        except CaseTimeout:
            failures.append(f"{case}: hang (> {CASE_TIMEOUT_S} s)")
            continue
        except BaseException as exc:  # noqa: BLE001 - the point is to catch everything
            failures.append(f"{case}: {type(exc).__name__}: {exc}")
            continue
        CODES[code] = CODES.get(code, 0) + 1
        failures += [f"{case}: {p}" for p in check(case, code, out, err)]
    return failures


@pytest.fixture()
def fuzz_folder(tmp_path: Path) -> Path:
    """A folder whose relative paths match the examples' (data/ for traces)."""
    (tmp_path / "data").symlink_to(ROOT / "examples" / "data", target_is_directory=True)
    (tmp_path / "bad.csv").write_bytes(b"arrived_at,num_prefill_tokens\n\xff\xfe,1\n")
    return tmp_path


def test_fuzzed_configs_end_in_a_result_or_one_named_error(fuzz_folder: Path) -> None:
    failures = fuzz(SEED, SAMPLE, fuzz_folder)
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else SEED
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "data").symlink_to(ROOT / "examples" / "data", target_is_directory=True)
        found = fuzz(seed, count, folder)
    print("\n".join(found) or "no failures")
    print(f"{len(found)} failures in {count} cases; exit codes {CODES}")
