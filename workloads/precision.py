"""Numeric formats of tensors and their sizes. The one table of bytes per element in llmsim."""

from __future__ import annotations

# Bytes per element as floats (int4 is half a byte: never use integer division here).
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp64": 8.0,
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


def bytes_per_element(precision: str) -> float:
    """Size of one element of ``precision`` in bytes; raises ValueError listing the known formats."""
    try:
        return BYTES_PER_ELEMENT[precision]
    except KeyError:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise ValueError(f"unknown precision '{precision}'; known: {known}") from None
