"""A TOML writer for the configs the planners emit (best.toml): tables of strings, numbers, booleans,
lists and inline tables; ``tomllib`` reads the result back to the same dict."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON escapes are valid TOML escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def dumps_toml(config: Mapping[str, Any]) -> str:
    """``config`` (sections of key -> value; nested tables one level deep become [section.sub])."""
    lines: list[str] = []
    for name, table in config.items():
        if not isinstance(table, Mapping):
            lines.append(f"{_key(name)} = {_value(table)}")
            continue
        lines.append(f"[{_key(name)}]")
        nested = []
        for key, value in table.items():
            if isinstance(value, Mapping):
                nested.append((key, value))
            else:
                lines.append(f"{_key(key)} = {_value(value)}")
        for key, value in nested:
            lines.append("")
            lines.append(f"[{_key(name)}.{_key(key)}]")
            lines += [f"{_key(k)} = {_value(v)}" for k, v in value.items()]
        lines.append("")
    return "\n".join(lines)
