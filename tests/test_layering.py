"""Architecture rule of DESIGN.md, enforced by parsing imports (never by convention alone).

hardware -> stdlib, numpy, scipy, networkx; workloads -> stdlib, numpy, networkx;
sim -> hardware, workloads (+ simpy, pandas, matplotlib); search -> sim, hardware, workloads (+ pulp);
validation -> sim, hardware, workloads. Only ``sim/cli.py`` may import search and validation, and
only inside functions (lazily).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"hardware", "workloads", "sim", "search", "validation"}
ALLOWED_PROJECT = {
    "hardware": {"hardware"},
    "workloads": {"workloads"},
    "sim": {"sim", "hardware", "workloads"},
    "search": {"search", "sim", "hardware", "workloads"},
    "validation": {"validation", "sim", "hardware", "workloads"},
}
ALLOWED_THIRD_PARTY = {
    "hardware": {"numpy", "scipy", "networkx"},
    "workloads": {"numpy", "networkx"},
    "sim": {"numpy", "scipy", "networkx", "simpy", "pandas", "matplotlib"},
    "search": {"numpy", "scipy", "networkx", "simpy", "pandas", "matplotlib", "pulp", "highspy", "dask", "distributed", "tqdm"},
    "validation": {"numpy", "scipy", "networkx", "simpy", "pandas", "matplotlib", "torch", "pyarrow", "tqdm"},
}


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level?) for every import in the file."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], not in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], not in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(PROJECT))
def test_package_imports_follow_the_layering(package: str) -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    violations = []
    for path in _files(package):
        rel = path.relative_to(ROOT).as_posix()
        for module, at_module_level in _imports(ast.parse(path.read_text(), filename=rel)):
            if module in stdlib:
                continue
            if module in PROJECT:
                if module in ALLOWED_PROJECT[package]:
                    continue
                if rel == "sim/cli.py" and module in {"search", "validation"} and not at_module_level:
                    continue
                violations.append(f"{rel} imports {module}")
            elif module not in ALLOWED_THIRD_PARTY[package]:
                violations.append(f"{rel} imports third-party {module}")
    assert violations == []


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    tree = ast.parse("import os\nfrom sim import cli\n\ndef f():\n    import search\n")
    assert _imports(tree) == [("os", True), ("sim", True), ("search", False)]
