"""Unit constants. Everything inside llmsim is in SI base units; multiply by these at the edges.

Decimal and binary prefixes are distinct: ``GB = 1e9`` bytes, ``GiB = 2**30`` bytes.
"""

from __future__ import annotations

# bytes
KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = float(2**10)
MiB = float(2**20)
GiB = float(2**30)
TiB = float(2**40)

# seconds
ns = 1e-9
us = 1e-6
ms = 1e-3

# rates
GBps = GB  # gigabytes per second, in bytes/s
Gbps = 1e9 / 8.0  # gigabits per second, in bytes/s
TFLOPS = 1e12  # FLOP/s
MHz = 1e6
GHz = 1e9
