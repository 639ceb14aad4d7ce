"""Write a config (nested dicts of TOML scalars, lists and tables) as TOML text that
``tomllib.loads`` reads back to the same dict: ``llmsim validate -v`` prints each row's config with it
so a user can re-run the row with ``llmsim simulate``, and the planners write best.toml with it."""

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
        return json.dumps(value)  # a JSON string literal is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) else json.dumps(key)


def dumps(config: Mapping[str, Any]) -> str:
    """``config`` as TOML: top-level scalars first, then one ``[table]`` per mapping (nested
    mappings as ``[table.sub]``)."""
    lines: list[str] = []

    def table(path: list[str], data: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in data.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in data.items() if isinstance(v, Mapping)]
        if path:
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars)
        for k, v in tables:
            table([*path, k], v)

    table([], config)
    return "\n".join(lines) + "\n"
