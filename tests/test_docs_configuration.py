"""docs/configuration.md cannot drift from the code: every key a config section accepts has a row in
the doc, and every row names a key the code accepts. The failure message says exactly what to add."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import search
from sim.config import KNOWN_SECTIONS
from sim.config_keys import key_tables

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADING = re.compile(r"^## \[([a-z_.]+)\]\s*$")
ROW = re.compile(r"^\| `([A-Za-z0-9_]+)` \|")


def documented_keys(text: str) -> dict[str, list[str]]:
    """``## [section]`` -> the keys in the first column of the rows that follow it."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            current = heading.group(1)
            sections[current] = []
        elif line.startswith("## "):
            current = None
        elif current is not None:
            row = ROW.match(line)
            if row:
                sections[current].append(row.group(1))
    return sections


def search_keys() -> tuple[str, ...]:
    """Union of the ``SEARCH_KEYS`` / ``*_SEARCH_KEYS`` constants of every module in ``search/``."""
    keys: set[str] = set()
    for info in pkgutil.iter_modules(search.__path__):
        module = importlib.import_module(f"search.{info.name}")
        for name, value in vars(module).items():
            if (name == "SEARCH_KEYS" or name.endswith("_SEARCH_KEYS")) and isinstance(value, tuple | list | set | frozenset):
                keys |= set(value)
    return tuple(sorted(keys))


def code_keys() -> dict[str, tuple[str, ...]]:
    tables = key_tables()
    tables["search"] = search_keys()
    return tables


def test_every_code_key_is_documented_and_every_documented_key_exists() -> None:
    doc = documented_keys(DOC.read_text(encoding="utf-8"))
    problems = []
    for section_name, keys in code_keys().items():
        if section_name not in doc:
            problems.append(
                f"docs/configuration.md has no section for [{section_name}]: add a heading '## [{section_name}]' "
                "followed by a table | key | type | default | allowed | meaning |"
            )
            continue
        for key in keys:
            if key not in doc[section_name]:
                problems.append(
                    f"[{section_name}] {key} is accepted by the code but not documented: add a row "
                    f"'| `{key}` | TYPE | DEFAULT | ALLOWED VALUES | MEANING (with units) |' under "
                    f"'## [{section_name}]' in docs/configuration.md"
                )
        for key in doc[section_name]:
            if key not in keys:
                problems.append(
                    f"docs/configuration.md documents [{section_name}] {key} but the code does not accept it: "
                    f"remove the row, or add '{key}' to the key table of [{section_name}] (sim/config_keys.py "
                    "lists where each table lives; [search] keys: a SEARCH_KEYS / *_SEARCH_KEYS constant in search/)"
                )
    for section_name in doc:
        if section_name not in code_keys():
            problems.append(
                f"docs/configuration.md has a section [{section_name}] the code has no key table for: "
                "register its keys in sim/config_keys.key_tables() (or remove the section)"
            )
    assert not problems, "\n".join(problems)


def test_every_top_level_section_is_documented() -> None:
    doc = documented_keys(DOC.read_text(encoding="utf-8"))
    missing = [name for name in KNOWN_SECTIONS if name not in doc]
    assert not missing, f"add '## [NAME]' sections to docs/configuration.md for {missing}"


def test_rows_have_five_columns() -> None:
    """key | type | default | allowed | meaning: a row with a missing cell is a broken table."""
    bad = [line for line in DOC.read_text(encoding="utf-8").splitlines()
           if ROW.match(line) and line.count("|") - line.count("\\|") != 6]
    assert not bad, f"rows of docs/configuration.md need exactly 5 cells: {bad}"
