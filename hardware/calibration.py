"""Calibration profiles: measured corrections of the analytic cost model for one GPU.

A profile (TOML, written by ``llmsim calibrate fit``) holds, per operation kind, a surface over a
regular grid of log2 shape coordinates whose values are the log of the measured efficiency over the
analytic model's efficiency (equivalently log(analytic kernel seconds / measured seconds)), and
curves for collectives and memory-bound kernels:

- ``[gemm.<precision>]``: axes log2 m, log2 n, log2 k (one GEMM, batch 1);
- ``[attention_prefill]``: causal prefill without cached prefix, axes log2 query tokens per
  sequence, log2 sequences, log2 heads, log2 head_dim;
- ``[attention_decode]``: one query token per sequence, axes log2 keys per sequence,
  log2 (sequences x KV heads), log2 head_dim, log2 (heads / KV heads);
- ``[memory]``: achieved fraction of HBM spec bandwidth by log2 bytes moved;
- ``[collective.<op>.<ranks>]``: measured seconds by log2 message bytes for a group inside one node;
- ``[custom_all_reduce.<framework>.<ranks>]``: the same for a serving framework's own all-reduce
  kernel (TensorRT-LLM's AllReduce plugin, vLLM's and SGLang's custom all-reduce), which serving
  stacks run for tensor-parallel all-reduces instead of NCCL (``for_tp_all_reduce``);
- ``launch_overhead_us``: measured per-kernel launch cost;
- ``gemm_clock``: the SM clock the GEMM and attention tables ran at, ``"sustained"`` (default) or
  ``"boost"`` (a collector times both alike: aiconfigurator's ``benchmark_with_power`` runs a few
  replays of each shape between idle set-up). GEMM and attention ratios are relative to the analytic
  model at that clock (``hardware.cost.sustained_clock_factor`` is 1 at ``"boost"``). Predictions always
  price the analytic model at the GPU's sustained clock and divide by the ratio, so a table timed in
  short bursts at the boost clock (``"boost"``) is slowed by sustained / boost clock on its
  compute-bound shapes, and one timed under sustained load (``"sustained"``) is reproduced.

Surfaces interpolate multilinearly inside their coverage box (the grid's bounds; the same values as
scipy's ``RegularGridInterpolator``, computed per point without arrays); outside it, and for ops a profile does not cover, the analytic default
applies. Lookups are memoized per shape, so a plan search pays the interpolation once per shape.
A profile fitted on the same GPU as the one simulated prices ops as ``measured``; one applied to a
different GPU (``[cluster] calibration`` naming another GPU's profile) as ``transferred``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hardware.errors import CatalogError

MEASURED = "measured"
TRANSFERRED = "transferred"
ROOFLINE = "roofline"
SOURCES = (MEASURED, TRANSFERRED, ROOFLINE)

SHIPPED_DIR = Path(__file__).parent / "calibration_profiles"

GEMM_AXES = ("log2_m", "log2_n", "log2_k")
PREFILL_AXES = ("log2_query_tokens", "log2_sequences", "log2_heads", "log2_head_dim")
# Fused attention surfaces are fitted on bf16 tables and apply to 16-bit attention (llmsim runs fused
# attention in bf16 even under fp8 GEMMs, ``sim.costmodel.attention_precision``).
ATTENTION_PRECISIONS = ("bf16", "fp16")
# The grid the analytic attention kernels reproduce: the FlashAttention 2 / 3 papers' benchmarks,
# whose bars the FA2 fit and the cuDNN and FA1 rates come from (arXiv 2307.08691 Sec. 4.1, "batch size
# so that the total number of tokens is 16k", hidden dimension 2048: 2048 / head_dim heads)
ATTENTION_REFERENCE_TOKENS = 16384
ATTENTION_REFERENCE_WIDTH = 2048
DECODE_AXES = ("log2_keys", "log2_sequences_x_kv_heads", "log2_head_dim", "log2_group")
# Grid coordinates are stored rounded to 6 decimals (log2 units); a shape on the grid's edge must not
# fall outside coverage by that rounding.
_EDGE_TOLERANCE = 1e-6
# SM clock a profile's GEMM tables ran at (module docstring, ``gemm_clock``).
GEMM_CLOCKS = ("sustained", "boost")


class CalibrationError(CatalogError):
    """A calibration profile that cannot be read or does not follow the format."""


@dataclass(frozen=True, eq=False, kw_only=True)
class Surface:
    """log(efficiency / analytic efficiency) on a regular grid of log2 coordinates."""

    axes: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]  # ascending log2 values per axis
    values: tuple[float, ...]  # C-order flattened grid values
    rows: int = 0  # measurements the fit used
    provenance: str = ""
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        size = math.prod(len(g) for g in self.grid)
        if len(self.axes) != len(self.grid) or size != len(self.values) or size == 0:
            raise CalibrationError(f"surface {self.axes}: grid {[len(g) for g in self.grid]} does not match {len(self.values)} values")
        for name, g in zip(self.axes, self.grid):
            if list(g) != sorted(set(g)):
                raise CalibrationError(f"surface axis {name}: values must be strictly ascending")

    def covers(self, point: Sequence[float]) -> bool:
        return all(g[0] - _EDGE_TOLERANCE <= x <= g[-1] + _EDGE_TOLERANCE for x, g in zip(point, self.grid))

    def ratio(self, point: tuple[float, ...]) -> float | None:
        """exp(surface) at ``point`` (measured efficiency / analytic efficiency), None outside coverage."""
        memo = self._memo
        if point in memo:
            return memo[point]
        result = math.exp(self.interpolate(point)) if self.covers(point) else None
        memo[point] = result
        return result

    def interpolate(self, point: Sequence[float]) -> float:
        """Multilinear interpolation of the grid at ``point`` (clamped to the grid): the same value as
        ``scipy.interpolate.RegularGridInterpolator(grid, values, method="linear")``, evaluated for one
        point without building arrays (a plan search asks for thousands of single shapes)."""
        corners: list[tuple[int, float]] = [(0, 1.0)]
        stride = len(self.values)
        for x, g in zip(point, self.grid):
            n = len(g)
            stride //= n
            if n == 1:
                continue
            x = min(max(x, g[0]), g[-1])
            i = min(bisect.bisect_right(g, x) - 1, n - 2)
            t = (x - g[i]) / (g[i + 1] - g[i])
            corners = [(base + (i + j) * stride, w * (t if j else 1.0 - t)) for base, w in corners for j in (0, 1)]
        values = self.values
        return sum(values[index] * w for index, w in corners if w)


@dataclass(frozen=True, eq=False, kw_only=True)
class Curve:
    """A 1-D table y(log2 x), interpolated linearly in (log2 x, log y) inside its x range."""

    log2_x: tuple[float, ...]
    y: tuple[float, ...]
    rows: int = 0
    provenance: str = ""
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if len(self.log2_x) != len(self.y) or not self.log2_x:
            raise CalibrationError("curve: x and y must be non-empty and of equal length")
        if list(self.log2_x) != sorted(set(self.log2_x)) or min(self.y) <= 0:
            raise CalibrationError("curve: x must be strictly ascending and y positive")

    def at(self, x: float) -> float | None:
        memo = self._memo
        if x in memo:
            return memo[x]
        lx = math.log2(x)
        xs, ys = self.log2_x, self.y
        result = None
        if xs[0] - _EDGE_TOLERANCE <= lx <= xs[-1] + _EDGE_TOLERANCE:
            lx = min(max(lx, xs[0]), xs[-1])
            i = min(max(bisect.bisect_right(xs, lx) - 1, 0), max(len(xs) - 2, 0))
            if len(xs) == 1:
                result = ys[0]
            else:
                t = (lx - xs[i]) / (xs[i + 1] - xs[i])
                result = math.exp((1 - t) * math.log(ys[i]) + t * math.log(ys[i + 1]))
        memo[x] = result
        return result


@dataclass(frozen=True, eq=False, kw_only=True)
class CalibrationProfile:
    """Every calibrated cost of one GPU (see the module docstring). Identity-hashed: a profile is
    loaded once per file and shared."""

    gpu: str  # catalog GPU the measurements were taken on
    source: str  # provenance (measurement file, tables, versions)
    gemm: Mapping[str, Surface] = field(default_factory=dict)
    attention_prefill: Surface | None = None
    attention_decode: Surface | None = None
    memory: Curve | None = None
    collectives: Mapping[tuple[str, int], Curve] = field(default_factory=dict)
    custom_all_reduce: Mapping[tuple[str, int], Curve] = field(default_factory=dict)  # (framework, ranks)
    launch_overhead_s: float | None = None
    gemm_clock: str = "sustained"  # SM clock the GEMM and attention tables ran at (GEMM_CLOCKS; see the module doc)
    path: str = ""
    _views: dict = field(default_factory=dict, repr=False)

    def source_for(self, gpu_name: str) -> str:
        return MEASURED if gpu_name == self.gpu else TRANSFERRED

    def describe(self) -> dict[str, str]:
        return {"file": Path(self.path).name if self.path else "", "gpu": self.gpu, "source": self.source}

    # --- lookups (None: outside coverage, the analytic default applies) ---------------------------
    def gemm_ratio(self, precision: str, m: int, n: int, k: int, batch: int) -> float | None:
        surface = self.gemm.get(precision)
        if surface is None or batch != 1:
            return None
        return surface.ratio((math.log2(m), math.log2(n), math.log2(k)))

    def attention_ratio(
        self, *, precision: str, num_sequences: int, query_tokens: int, key_tokens: int, heads: int, kv_heads: int,
        head_dim: int, v_head_dim: int, causal: bool, backward: bool,
    ) -> float | None:
        """Measured tables time forward, causal, equal QK/V head dims: prefill without cached prefix
        (key tokens = query tokens) or pure decode (one query per sequence)."""
        if backward or not causal or head_dim != v_head_dim or num_sequences < 1 or query_tokens < 1:
            return None
        if precision not in ATTENTION_PRECISIONS:
            return None
        if key_tokens == query_tokens:
            if self.attention_prefill is None:
                return None
            return self.attention_prefill.ratio((
                math.log2(query_tokens / num_sequences), math.log2(num_sequences), math.log2(heads), math.log2(head_dim),
            ))
        if query_tokens == num_sequences and self.attention_decode is not None:
            return self.attention_decode.ratio((
                math.log2(key_tokens / num_sequences), math.log2(num_sequences * kv_heads),
                math.log2(head_dim), math.log2(heads / kv_heads),
            ))
        return None

    def attention_grid_occupancy(
        self, *, precision: str, num_sequences: int, query_tokens: int, heads: int, head_dim: int,
    ) -> float | None:
        """The share of its benchmarked rate a causal prefill-shaped attention kernel keeps with
        ``num_sequences`` x ``heads`` (its grid: sequences x heads x query blocks thread blocks): the
        measured prefill surface at this shape over its value at the FlashAttention benchmarks' grid
        of the same sequence length and head dim (ATTENTION_REFERENCE_TOKENS tokens in all,
        ATTENTION_REFERENCE_WIDTH / head_dim heads), where the analytic kernels were fitted; at most 1.
        With fewer sequences and heads the kernel's thread blocks, of unequal causal work, leave SMs
        idle: the H100 surface falls to 0.59 of the benchmarks' value at one sequence of 2,048 tokens
        with 12 heads. None where the profile has no prefill surface or the shape is outside it."""
        if self.attention_prefill is None or precision not in ATTENTION_PRECISIONS:
            return None
        if num_sequences < 1 or query_tokens < num_sequences or head_dim > ATTENTION_REFERENCE_WIDTH:
            return None
        per_sequence = query_tokens / num_sequences
        reference_sequences = max(1.0, ATTENTION_REFERENCE_TOKENS / per_sequence)
        log_length, log_dim = math.log2(per_sequence), math.log2(head_dim)
        here = self.attention_prefill.ratio((log_length, math.log2(num_sequences), math.log2(heads), log_dim))
        reference = self.attention_prefill.ratio(
            (log_length, math.log2(reference_sequences), math.log2(ATTENTION_REFERENCE_WIDTH / head_dim), log_dim)
        )
        if here is None or reference is None:
            return None
        return min(1.0, here / reference)

    def memory_efficiency(self, bytes_moved: float) -> float | None:
        return None if self.memory is None or bytes_moved <= 0 else self.memory.at(bytes_moved)

    def collective_s(self, kind: str, ranks: int, message_bytes: float) -> float | None:
        curve = self.collectives.get((kind, ranks))
        return None if curve is None or message_bytes <= 0 else curve.at(message_bytes)

    def for_tp_all_reduce(self, framework: str, max_bytes: float = 0.0) -> CalibrationProfile:
        """This profile as a serving stack of ``framework`` sees it: its tensor-parallel all-reduces run
        the framework's own all-reduce where measured. With ``max_bytes`` 0, at each size the faster of
        that kernel and NCCL (TensorRT-LLM's AllReduceStrategy AUTO picks per size); with ``max_bytes``
        > 0, the framework's kernel for messages of at most ``max_bytes`` and NCCL above, whichever
        is faster (vLLM's ``should_custom_ar`` size limit). Itself when the profile has no curve of
        ``framework``."""
        key = (framework, float(max_bytes))
        view = self._views.get(key)
        if view is None:
            curves = {ranks: c for (fw, ranks), c in self.custom_all_reduce.items() if fw == framework}
            if not curves:
                view = self
            else:
                collectives = dict(self.collectives)
                for ranks, custom in curves.items():
                    nccl = collectives.get(("all_reduce", ranks))
                    if max_bytes > 0:
                        collectives[("all_reduce", ranks)] = SizeSwitch(below=custom, above=nccl, max_bytes=float(max_bytes))
                    else:
                        collectives[("all_reduce", ranks)] = custom if nccl is None else _faster(custom, nccl)
                view = dataclasses.replace(self, collectives=collectives, custom_all_reduce={}, _views={})
            self._views[key] = view
        return view


@dataclass(frozen=True, eq=False, kw_only=True)
class SizeSwitch:
    """A collective whose implementation switches by message size: ``below`` for messages of at most
    ``max_bytes`` bytes, ``above`` past it and where ``below`` is not measured (None where neither
    is: the analytic default applies)."""

    below: Curve
    above: Curve | None
    max_bytes: float

    @property
    def rows(self) -> int:
        return self.below.rows + (self.above.rows if self.above is not None else 0)

    @property
    def provenance(self) -> str:
        above = self.above.provenance if self.above is not None else "the analytic NCCL model"
        return f"{self.below.provenance} up to {self.max_bytes:.0f} B, {above} past it"

    def at(self, x: float) -> float | None:
        if x <= self.max_bytes:
            measured = self.below.at(x)
            if measured is not None:
                return measured
        return None if self.above is None else self.above.at(x)


def _faster(a: Curve, b: Curve) -> Curve:
    """The pointwise faster of two latency curves, on the union of their sizes (where only one is
    measured, that one)."""
    xs = sorted(set(a.log2_x) | set(b.log2_x))
    ys = []
    for x in xs:
        values = [v for v in (a.at(2.0 ** x), b.at(2.0 ** x)) if v is not None]
        ys.append(min(values))
    return Curve(log2_x=tuple(xs), y=tuple(ys), rows=a.rows + b.rows, provenance=f"faster of {a.provenance} and {b.provenance}")


# --- TOML -------------------------------------------------------------------------------------------
def _numbers(value: Any) -> tuple[float, ...]:
    """A TOML array of numbers, or one string of whitespace-separated numbers (how large surfaces
    are written, as a literal multi-line string: TOML parsers read it ten times faster than an array)."""
    if isinstance(value, str):
        return tuple(float(v) for v in value.split())
    return tuple(float(v) for v in value)


def _surface(table: Mapping[str, Any], where: str, axes: tuple[str, ...]) -> Surface:
    try:
        return Surface(
            axes=axes, grid=tuple(tuple(float(v) for v in table[a]) for a in axes),
            values=_numbers(table["log_ratio"]), rows=int(table.get("rows", 0)),
            provenance=str(table.get("provenance", "")),
        )
    except KeyError as exc:
        raise CalibrationError(f"{where}: missing key {exc.args[0]!r} (needs {', '.join(axes)}, log_ratio)") from None
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{where}: {exc}") from None


def _curve(table: Mapping[str, Any], where: str, y_key: str) -> Curve:
    try:
        return Curve(
            log2_x=tuple(float(v) for v in table["log2_bytes"]), y=tuple(float(v) for v in table[y_key]),
            rows=int(table.get("rows", 0)), provenance=str(table.get("provenance", "")),
        )
    except KeyError as exc:
        raise CalibrationError(f"{where}: missing key {exc.args[0]!r} (needs log2_bytes, {y_key})") from None
    except (TypeError, ValueError) as exc:
        raise CalibrationError(f"{where}: {exc}") from None


PROFILE_KEYS = (
    "gpu", "source", "launch_overhead_us", "gemm_clock", "gemm", "attention_prefill", "attention_decode", "memory", "collective",
    "custom_all_reduce",
)


def parse_profile(data: Mapping[str, Any], where: str) -> CalibrationProfile:
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise CalibrationError(f"{where}: unknown keys {unknown}; allowed: {', '.join(PROFILE_KEYS)}")
    if not isinstance(data.get("gpu"), str):
        raise CalibrationError(f"{where}: needs gpu = \"<catalog GPU name>\" (the GPU it was measured on)")
    gemm = {p: _surface(t, f"{where} [gemm.{p}]", GEMM_AXES) for p, t in data.get("gemm", {}).items()}
    prefill = data.get("attention_prefill")
    decode = data.get("attention_decode")
    memory = data.get("memory")
    collectives = {}
    for op, by_ranks in data.get("collective", {}).items():
        for ranks, table in by_ranks.items():
            collectives[(op, int(ranks))] = _curve(table, f"{where} [collective.{op}.{ranks}]", "latency_s")
    custom = {}
    for framework, by_ranks in data.get("custom_all_reduce", {}).items():
        for ranks, table in by_ranks.items():
            custom[(framework, int(ranks))] = _curve(table, f"{where} [custom_all_reduce.{framework}.{ranks}]", "latency_s")
    launch_us = data.get("launch_overhead_us")
    if launch_us is not None and (not isinstance(launch_us, (int, float)) or launch_us <= 0):
        raise CalibrationError(f"{where}: launch_overhead_us = {launch_us!r} must be a positive number")
    gemm_clock = data.get("gemm_clock", "sustained")
    if gemm_clock not in GEMM_CLOCKS:
        raise CalibrationError(f"{where}: gemm_clock = {gemm_clock!r} must be one of {', '.join(GEMM_CLOCKS)}")
    return CalibrationProfile(
        gpu=data["gpu"], source=str(data.get("source", "")), gemm=gemm,
        attention_prefill=_surface(prefill, f"{where} [attention_prefill]", PREFILL_AXES) if prefill else None,
        attention_decode=_surface(decode, f"{where} [attention_decode]", DECODE_AXES) if decode else None,
        memory=_curve(memory, f"{where} [memory]", "efficiency") if memory else None,
        collectives=collectives, custom_all_reduce=custom,
        launch_overhead_s=None if launch_us is None else float(launch_us) * 1e-6,
        gemm_clock=gemm_clock, path=where,
    )


_LOADED: dict[str, CalibrationProfile] = {}


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read a profile TOML (memoized per resolved path)."""
    path = Path(path)
    key = str(path.resolve())
    if key not in _LOADED:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise CalibrationError(f"calibration profile {str(path)!r} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise CalibrationError(f"calibration profile {str(path)!r} is not valid TOML: {exc}") from None
        _LOADED[key] = parse_profile(data, str(path))
    return _LOADED[key]


def shipped_profile_path(gpu_name: str) -> Path | None:
    path = SHIPPED_DIR / f"{gpu_name}.toml"
    return path if path.is_file() else None


class ShippedProfile:
    """The profile shipped for a catalog GPU, read from its file on first use (so loading the
    catalog does not parse every profile). Same lookups as ``CalibrationProfile``."""

    __slots__ = ("path", "gpu", "_profile")

    def __init__(self, path: Path, gpu: str) -> None:
        self.path = str(path)
        self.gpu = gpu
        self._profile: CalibrationProfile | None = None

    @property
    def profile(self) -> CalibrationProfile:
        if self._profile is None:
            self._profile = load_profile(self.path)
            if self._profile.gpu != self.gpu:
                raise CalibrationError(f"{self.path}: gpu = {self._profile.gpu!r}, expected {self.gpu!r}")
        return self._profile

    @property
    def source(self) -> str:
        return self.profile.source

    @property
    def launch_overhead_s(self) -> float | None:
        return self.profile.launch_overhead_s

    def source_for(self, gpu_name: str) -> str:
        return self.profile.source_for(gpu_name)

    def describe(self) -> dict[str, str]:
        return {"file": Path(self.path).name, "gpu": self.gpu, "source": "shipped profile (hardware/calibration_profiles)"}

    def gemm_ratio(self, precision: str, m: int, n: int, k: int, batch: int) -> float | None:
        return self.profile.gemm_ratio(precision, m, n, k, batch)

    def attention_ratio(self, **kwargs: Any) -> float | None:
        return self.profile.attention_ratio(**kwargs)

    def attention_grid_occupancy(self, **kwargs: Any) -> float | None:
        return self.profile.attention_grid_occupancy(**kwargs)

    def memory_efficiency(self, bytes_moved: float) -> float | None:
        return self.profile.memory_efficiency(bytes_moved)

    def collective_s(self, kind: str, ranks: int, message_bytes: float) -> float | None:
        return self.profile.collective_s(kind, ranks, message_bytes)

    def for_tp_all_reduce(self, framework: str, max_bytes: float = 0.0) -> CalibrationProfile | ShippedProfile:
        view = self.profile.for_tp_all_reduce(framework, max_bytes)
        return self if view is self.profile else view


def shipped_profile(gpu_name: str) -> ShippedProfile | None:
    path = shipped_profile_path(gpu_name)
    return None if path is None else ShippedProfile(path, gpu_name)


def _fmt(values: Sequence[float], digits: int = 6) -> str:
    return "[" + ", ".join(format(float(v), f".{digits}g") for v in values) + "]"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile_toml(profile: CalibrationProfile, header: str = "") -> str:
    """The profile as TOML text that ``parse_profile`` reads back to equal tables."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines += [f"gpu = {_quote(profile.gpu)}", f"source = {_quote(profile.source)}"]
    if profile.launch_overhead_s is not None:
        lines.append(f"launch_overhead_us = {profile.launch_overhead_s * 1e6:.6g}")
    if profile.gemm_clock != "sustained":
        lines.append(f"gemm_clock = {_quote(profile.gemm_clock)}")

    def surface(name: str, s: Surface) -> None:
        lines.extend(["", f"[{name}]", f"rows = {s.rows}", f"provenance = {_quote(s.provenance)}"])
        lines.extend(f"{a} = {_fmt(g, 9)}" for a, g in zip(s.axes, s.grid))
        # values in C order (last axis fastest), whitespace-separated, 3 decimals (0.1 % in ratio)
        lines.append("log_ratio = '''")
        per_line = len(s.grid[-1])
        for start in range(0, len(s.values), per_line):
            lines.append(" ".join(f"{v:.3f}" for v in s.values[start:start + per_line]))
        lines.append("'''")

    for precision, s in sorted(profile.gemm.items()):
        surface(f"gemm.{precision}", s)
    if profile.attention_prefill is not None:
        surface("attention_prefill", profile.attention_prefill)
    if profile.attention_decode is not None:
        surface("attention_decode", profile.attention_decode)
    if profile.memory is not None:
        m = profile.memory
        lines.extend(["", "[memory]", f"rows = {m.rows}", f"provenance = {_quote(m.provenance)}",
                      f"log2_bytes = {_fmt(m.log2_x, 9)}", f"efficiency = {_fmt(m.y, 5)}"])
    for (op, ranks), c in sorted(profile.collectives.items()):
        lines.extend(["", f"[collective.{op}.{ranks}]", f"rows = {c.rows}", f"provenance = {_quote(c.provenance)}",
                      f"log2_bytes = {_fmt(c.log2_x, 9)}", f"latency_s = {_fmt(c.y, 5)}"])
    for (framework, ranks), c in sorted(profile.custom_all_reduce.items()):
        lines.extend(["", f"[custom_all_reduce.{framework}.{ranks}]", f"rows = {c.rows}",
                      f"provenance = {_quote(c.provenance)}", f"log2_bytes = {_fmt(c.log2_x, 9)}",
                      f"latency_s = {_fmt(c.y, 5)}"])
    return "\n".join(lines) + "\n"
