"""Request streams for serving: arrival processes, length distributions, trace readers, sessions.

Hardware-agnostic: a request is a prompt length, an output length, an arrival time and, when known,
the hashes of its prompt's blocks (equal hashes = equal content, for prefix caching).

Arrival processes (``[workload] arrival``):

- ``poisson``: exponential inter-arrival gaps with mean ``1 / rate_per_s``.
- ``gamma``: gamma gaps with shape ``k = burstiness`` and scale ``1 / (rate_per_s * k)``, as vLLM's
  benchmark draws them (vllm/benchmarks/serve.py, per ../shared/reference/formulas.md "Queueing / SLO /
  goodput"): mean gap ``1 / rate`` and coefficient of variation ``1 / sqrt(k)``; k = 1 is Poisson.
  Unlike recent vLLM versions we do not rescale the drawn times to span exactly N / rate: the stream
  is a plain renewal process, so its realized rate fluctuates as a real one does.
- ``offline``: every request at t = 0 (``rate_per_s`` is ignored).
- ``trace``: timestamps and lengths from a file (see :func:`read_trace`), shifted so the first
  request arrives at t = 0. ``num_requests`` keeps the first N rows. Time can be stretched by
  ``time_scale`` (arrival times multiplied by it: 0.5 doubles the rate) or by ``rate_per_s`` (times
  rescaled so that (N - 1) / span equals it, which keeps the trace's burstiness and lets a rate sweep
  use a real trace); giving both is an error. ``prompt_tokens`` / ``output_tokens``, when given,
  replace the trace's lengths with draws from the distribution.

Synthetic streams start with their first request at t = 0 followed by N - 1 drawn gaps.

Lengths (``prompt_tokens``, ``output_tokens``, ``sessions.turns``): an integer, or a table with
``distribution`` = ``fixed`` (``value``) | ``uniform`` (integers in [``min``, ``max``]) | ``normal``
(``mean``, ``std``) | ``lognormal`` (``sigma`` and exactly one of ``mu`` (mean of log tokens),
``median`` (= exp(mu)) or ``mean`` (= exp(mu + sigma^2 / 2))) | ``zipf`` (bounded Zipf on the
integers [``min``, ``max``], P(min + r) proportional to (r + 1)^-``exponent``, as Vidur's Zipf length
generator without scrambling) | ``empirical`` (values of ``column`` in the CSV file ``path``, sampled
uniformly with replacement). Draws are rounded to the nearest integer and clipped to
[max(1, ``min``), ``max``].

Multi-turn sessions (``[workload.sessions]``: ``turns``, ``think_time_s``, optional
``max_context_tokens``): session starts follow the arrival process at ``rate_per_s`` (sessions per
second). Turn k + 1's prompt is turn k's prompt + turn k's output + new user tokens drawn from
``prompt_tokens``; outputs are drawn from ``output_tokens``. An open-loop generator cannot know when
turn k finishes, so turn k + 1 arrives at turn k's *arrival* plus an exponential think time with mean
``think_time_s`` (choose it above the expected end-to-end latency for a realistic conversation).
A session stops before a turn whose prompt + output would exceed ``max_context_tokens`` (the first
turn is always kept). ``num_requests`` counts requests (turns): the N earliest turns are kept.

``shared_prefix_tokens`` (any synthetic arrival) prepends that many tokens of common content (a
system prompt) to every prompt. Prompt blocks of ``prefix_block_tokens`` tokens get hashes whenever
sessions or a shared prefix are used: blocks wholly inside the shared prefix share one hash
sequence across all requests, later blocks are unique to the session (or the single request).
Without them ``prefix_hashes`` is empty: no reusable content is known.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from workloads.errors import WorkloadError
from workloads.traces import read_trace_rows

ARRIVALS = ("poisson", "gamma", "offline", "trace")
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal", "zipf", "empirical")
_LENGTH_KEYS = {
    "fixed": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "normal": ({"mean", "std"}, {"min", "max"}),
    "lognormal": ({"sigma"}, {"mu", "median", "mean", "min", "max"}),
    "zipf": ({"exponent", "min", "max"}, set()),
    "empirical": ({"path", "column"}, {"min", "max"}),
}
_WORKLOAD_KEYS = (
    "arrival", "rate_per_s", "burstiness", "num_requests", "prompt_tokens", "output_tokens", "trace",
    "time_scale", "shared_prefix_tokens", "prefix_block_tokens", "sessions", "seed",
)
_SESSION_KEYS = ("turns", "think_time_s", "max_context_tokens")
# Size limits (docs/configuration.md), each named in its error. The serving engine simulates about
# 1,000-1,500 requests per second of wall time on one core (README, Speed: 100,000 requests in ~80 s),
# so 200,000 requests take about three minutes; split longer studies into several runs.
MAX_NUM_REQUESTS = 200_000
MAX_TOKENS = 10_000_000  # longest request length (prompt or output), past every published context window
# Decode is one engine step per output token and request, so a request's output length bounds the
# steps a run takes (~30 us each): 131,072 (128 Ki, the largest output limit of served models) keeps a
# run within seconds, where 10^6 took 30-45 s per scheduler.
MAX_OUTPUT_TOKENS = 131_072
MAX_ZIPF_VALUES = 1_000_000  # a zipf length keeps one probability per value of [min, max]
MAX_LOGNORMAL_MU = 40.0  # exp(40) tokens is already 10^10 times MAX_TOKENS
MAX_LOGNORMAL_SIGMA = 10.0
# Hash namespaces for synthetic prefixes: shared-prefix block b -> -(b + 1); block b of session or
# request j -> (j + 1) * 2**32 + b (2**32 blocks per owner is beyond any context length).
_OWNER_STRIDE = 2**32


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    """One request of a stream; times in seconds from the stream's start."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    session_id: int | None = None
    prefix_hashes: tuple[int, ...] = ()  # one per full prompt block; equal hashes = shared content
    prefix_block_tokens: int = 16

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise WorkloadError(
                f"request {self.request_id}: prompt_tokens = {self.prompt_tokens} and output_tokens = "
                f"{self.output_tokens} must both be >= 1"
            )
        if self.arrival_s < 0 or not math.isfinite(self.arrival_s):
            raise WorkloadError(f"request {self.request_id}: arrival_s = {self.arrival_s} must be finite and >= 0")
        if self.prefix_block_tokens < 1:
            raise WorkloadError(f"request {self.request_id}: prefix_block_tokens = {self.prefix_block_tokens} must be >= 1")
        full_blocks = self.prompt_tokens // self.prefix_block_tokens
        if len(self.prefix_hashes) > full_blocks:
            raise WorkloadError(
                f"request {self.request_id}: {len(self.prefix_hashes)} prefix_hashes but only {full_blocks} full "
                f"blocks of {self.prefix_block_tokens} tokens in a {self.prompt_tokens}-token prompt"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthSpec:
    """A token-count distribution (see the module docstring); draws are clipped to [min_tokens, max_tokens]."""

    distribution: str = "fixed"
    value: int | None = None  # fixed
    mean: float | None = None  # normal
    std: float | None = None  # normal
    mu: float | None = None  # lognormal: mean of ln(tokens)
    sigma: float | None = None  # lognormal: std of ln(tokens)
    exponent: float | None = None  # zipf
    values: tuple[int, ...] = ()  # empirical sample
    source: str = ""  # empirical: "path:column", for messages and run records
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        d = self.distribution
        if d not in DISTRIBUTIONS:
            raise WorkloadError(f"distribution = {d!r} is unknown; allowed: {', '.join(DISTRIBUTIONS)}")
        if self.min_tokens < 1:
            raise WorkloadError(f"min = {self.min_tokens} must be >= 1")
        for name, bound in (("min", self.min_tokens), ("max", self.max_tokens), ("value", self.value)):
            if bound is not None and bound > MAX_TOKENS:
                raise WorkloadError(f"{name} = {bound} is past the limit {MAX_TOKENS:,}")
        for name, number, limit in (("mean", self.mean, MAX_TOKENS), ("std", self.std, MAX_TOKENS),
                                    ("mu", self.mu, MAX_LOGNORMAL_MU), ("sigma", self.sigma, MAX_LOGNORMAL_SIGMA)):
            if number is not None and not (math.isfinite(number) and abs(number) <= limit):
                raise WorkloadError(f"{name} = {number!r} must be a finite number within +-{limit:,g}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise WorkloadError(f"max = {self.max_tokens} must be >= min = {self.min_tokens}")
        if d == "fixed" and (self.value is None or self.value < 1):
            raise WorkloadError(f"fixed value = {self.value!r} must be an integer >= 1")
        if d == "normal" and (self.mean is None or self.std is None or self.std < 0):
            raise WorkloadError(f"normal needs mean and std >= 0, got mean = {self.mean!r}, std = {self.std!r}")
        if d == "lognormal" and (self.mu is None or self.sigma is None or self.sigma < 0):
            raise WorkloadError(f"lognormal needs mu and sigma >= 0, got mu = {self.mu!r}, sigma = {self.sigma!r}")
        if d in ("uniform", "zipf") and self.max_tokens is None:
            raise WorkloadError(f"{d} needs both min and max")
        if d == "zipf" and (self.exponent is None or not 0 < self.exponent <= 1e3):
            raise WorkloadError(f"zipf exponent = {self.exponent!r} must be in (0, 1000]")
        if d == "zipf" and self.max_tokens - self.min_tokens + 1 > MAX_ZIPF_VALUES:  # type: ignore[operator]
            raise WorkloadError(
                f"zipf over [{self.min_tokens}, {self.max_tokens}] has {self.max_tokens - self.min_tokens + 1:,} values, "  # type: ignore[operator]
                f"past the limit of {MAX_ZIPF_VALUES:,}"
            )
        if d == "empirical" and not self.values:
            raise WorkloadError(f"empirical sample {self.source!r} has no values")

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` token counts (int64), rounded and clipped."""
        d = self.distribution
        if d == "fixed":
            drawn = np.full(size, float(self.value))  # type: ignore[arg-type]
        elif d == "uniform":
            drawn = rng.integers(self.min_tokens, self.max_tokens, size=size, endpoint=True).astype(float)
        elif d == "normal":
            drawn = rng.normal(self.mean, self.std, size=size)
        elif d == "lognormal":
            drawn = rng.lognormal(self.mu, self.sigma, size=size)
        elif d == "zipf":
            drawn = self.min_tokens + rng.choice(len(p := self._zipf_probabilities()), size=size, p=p).astype(float)
        else:
            drawn = rng.choice(np.asarray(self.values, dtype=float), size=size)
        upper = MAX_TOKENS if self.max_tokens is None else self.max_tokens
        return np.clip(np.rint(drawn), self.min_tokens, upper).astype(np.int64)

    def nominal_mean(self) -> float:
        """Mean of the distribution before rounding and clipping (exact for fixed, uniform, zipf, empirical)."""
        d = self.distribution
        if d == "fixed":
            return float(self.value)  # type: ignore[arg-type]
        if d == "uniform":
            return (self.min_tokens + self.max_tokens) / 2  # type: ignore[operator]
        if d == "normal":
            return float(self.mean)  # type: ignore[arg-type]
        if d == "lognormal":
            return math.exp(self.mu + self.sigma**2 / 2)  # type: ignore[operator]
        if d == "zipf":
            p = self._zipf_probabilities()
            return float(self.min_tokens + np.dot(np.arange(len(p)), p))
        return float(np.mean(self.values))

    def _zipf_probabilities(self) -> np.ndarray:
        ranks = np.arange(1, self.max_tokens - self.min_tokens + 2, dtype=float)  # type: ignore[operator]
        weights = ranks ** -float(self.exponent)  # type: ignore[arg-type]
        return weights / weights.sum()


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSpec:
    """Multi-turn conversations: turns per session, mean think time between turn arrivals."""

    turns: LengthSpec
    think_time_s: float
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.think_time_s >= 0:
            raise WorkloadError(f"workload.sessions.think_time_s = {self.think_time_s!r} must be >= 0")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise WorkloadError(f"workload.sessions.max_context_tokens = {self.max_context_tokens} must be >= 2")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """The ``[workload]`` table, validated (see the module docstring for the semantics)."""

    arrival: str = "poisson"
    rate_per_s: float | None = None
    burstiness: float = 1.0
    num_requests: int | None = None  # required unless arrival = "trace" (then: first N rows; None = all)
    prompt_tokens: LengthSpec | None = None
    output_tokens: LengthSpec | None = None
    trace: str | None = None  # resolved path of the trace file
    time_scale: float | None = None
    shared_prefix_tokens: int = 0
    prefix_block_tokens: int = 16
    sessions: SessionSpec | None = None
    seed: int | None = None  # the caller builds the Generator; build_requests never reads this

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise WorkloadError(f"workload.arrival = {self.arrival!r} is unknown; allowed: {', '.join(ARRIVALS)}")
        if self.rate_per_s is not None and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise WorkloadError(f"workload.rate_per_s = {self.rate_per_s!r} must be a positive number")
        if not self.burstiness > 0:
            raise WorkloadError(f"workload.burstiness = {self.burstiness!r} must be > 0")
        if self.num_requests is not None and self.num_requests < 1:
            raise WorkloadError(f"workload.num_requests = {self.num_requests} must be >= 1")
        if self.num_requests is not None and self.num_requests > MAX_NUM_REQUESTS:
            raise WorkloadError(
                f"workload.num_requests = {self.num_requests:,} is past the limit of {MAX_NUM_REQUESTS:,} "
                "(the engine simulates about 1,000 requests per second of wall time; split the study into runs)"
            )
        if self.seed is not None and self.seed < 0:
            raise WorkloadError(f"workload.seed = {self.seed} must be >= 0")
        if self.burstiness is not None and not (math.isfinite(self.burstiness) and self.burstiness <= 1e6):
            raise WorkloadError(f"workload.burstiness = {self.burstiness!r} must be a finite number in (0, 1e6]")
        if self.time_scale is not None and not self.time_scale > 0:
            raise WorkloadError(f"workload.time_scale = {self.time_scale!r} must be > 0")
        if not 0 <= self.shared_prefix_tokens <= MAX_TOKENS:
            raise WorkloadError(f"workload.shared_prefix_tokens = {self.shared_prefix_tokens} must be in [0, {MAX_TOKENS:,}]")
        if self.prefix_block_tokens > MAX_TOKENS:
            raise WorkloadError(f"workload.prefix_block_tokens = {self.prefix_block_tokens} is past the limit {MAX_TOKENS:,}")
        if self.prefix_block_tokens < 1:
            raise WorkloadError(f"workload.prefix_block_tokens = {self.prefix_block_tokens} must be >= 1")
        if self.arrival == "trace":
            if self.trace is None:
                raise WorkloadError("workload.trace is required when arrival = 'trace'")
            if self.time_scale is not None and self.rate_per_s is not None:
                raise WorkloadError("workload.time_scale and workload.rate_per_s both rescale a trace; give one")
            if self.sessions is not None or self.shared_prefix_tokens:
                raise WorkloadError("workload.sessions / shared_prefix_tokens need a synthetic arrival, not 'trace'")
            return
        if self.time_scale is not None:
            raise WorkloadError(f"workload.time_scale applies to arrival = 'trace' only, not {self.arrival!r}")
        if self.trace is not None:
            raise WorkloadError(f"workload.trace applies to arrival = 'trace' only, not {self.arrival!r}; "
                                "set arrival = 'trace' to replay it")
        if self.arrival in ("poisson", "gamma") and self.rate_per_s is None:
            raise WorkloadError(f"workload.rate_per_s is required for arrival = {self.arrival!r}")
        for name in ("num_requests", "prompt_tokens", "output_tokens"):
            if getattr(self, name) is None:
                raise WorkloadError(f"workload.{name} is required for arrival = {self.arrival!r}")


# ---------------------------------------------------------------- parsing


def _number(table: Mapping[str, Any], key: str, where: str, *, integer: bool = False) -> Any:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise WorkloadError(f"{where}.{key} = {value!r} must be {kind}")
    if not math.isfinite(value):
        raise WorkloadError(f"{where}.{key} = {value!r} must be a finite number")
    return value if integer else float(value)


def parse_length(value: Any, where: str, base_dir: Path | None = None) -> LengthSpec:
    """An integer (fixed) or a distribution table -> LengthSpec; ``where`` names the field in errors."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_TOKENS:
            raise WorkloadError(f"{where} = {value} must be in [1, {MAX_TOKENS:,}]")
        return LengthSpec(distribution="fixed", value=value)
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{where} = {value!r} must be an integer or a table with 'distribution'")
    dist = value.get("distribution")
    if dist not in _LENGTH_KEYS:
        raise WorkloadError(f"{where}.distribution = {dist!r} is unknown; allowed: {', '.join(DISTRIBUTIONS)}")
    required, optional = _LENGTH_KEYS[dist]
    keys = set(value) - {"distribution"}
    if required - keys:
        raise WorkloadError(f"{where}: {dist} needs {sorted(required)}; missing {sorted(required - keys)}")
    if keys - required - optional:
        raise WorkloadError(
            f"{where}: unknown keys {sorted(keys - required - optional)} for {dist}; allowed: {sorted(required | optional)}"
        )
    fields: dict[str, Any] = {"distribution": dist}
    if "min" in value:
        fields["min_tokens"] = _number(value, "min", where, integer=True)
    if "max" in value:
        fields["max_tokens"] = _number(value, "max", where, integer=True)
    if dist == "fixed":
        fields["value"] = _number(value, "value", where, integer=True)
    elif dist == "normal":
        fields["mean"], fields["std"] = _number(value, "mean", where), _number(value, "std", where)
    elif dist == "lognormal":
        given = [key for key in ("mu", "median", "mean") if key in value]
        if len(given) != 1:
            raise WorkloadError(f"{where}: lognormal needs exactly one of mu, median, mean; got {given}")
        sigma = fields["sigma"] = _number(value, "sigma", where)
        location = _number(value, given[0], where)
        if given[0] != "mu" and location <= 0:
            raise WorkloadError(f"{where}.{given[0]} = {location} must be > 0")
        # median = exp(mu); mean = exp(mu + sigma^2 / 2)
        fields["mu"] = {"mu": location, "median": math.log(location), "mean": math.log(location) - sigma**2 / 2}[given[0]]
    elif dist == "zipf":
        fields["exponent"] = _number(value, "exponent", where)
    elif dist == "empirical":
        path = _resolve(value["path"], base_dir, f"{where}.path")
        fields["values"] = _read_column(path, value["column"], f"{where}.column")
        fields["source"] = f"{path}:{value['column']}"
    try:
        return LengthSpec(**fields)
    except WorkloadError as exc:
        raise WorkloadError(f"{where}: {exc}") from None


def _largest(length: LengthSpec) -> int:
    """The longest length ``length`` is set to draw: its value, sample maximum or clip (0 for an
    unclipped normal or lognormal, whose tail the user did not bound)."""
    if length.distribution == "fixed":
        return int(length.value)  # type: ignore[arg-type]
    if length.distribution == "empirical":
        return min(max(length.values), length.max_tokens or MAX_TOKENS)
    return length.max_tokens or 0


def _resolve(path: Any, base_dir: Path | None, where: str) -> Path:
    if not isinstance(path, str | Path):
        raise WorkloadError(f"{where} = {path!r} must be a file path string")
    resolved = Path(path)
    if not resolved.is_absolute() and base_dir is not None:
        resolved = Path(base_dir) / resolved
    if resolved.is_dir():
        raise WorkloadError(f"{where} = '{path}' is a folder, not a file (resolved to '{resolved}')")
    if not resolved.is_file():
        raise WorkloadError(f"{where} = '{path}': file not found (resolved to '{resolved}')")
    return resolved


def _read_column(path: Path, column: Any, where: str) -> tuple[int, ...]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if column not in (reader.fieldnames or ()):
                raise WorkloadError(f"{where} = {column!r} is not a column of '{path}'; columns: {reader.fieldnames}")
            values = []
            for line, row in enumerate(reader, start=2):
                try:
                    value = float(row[column])
                except (TypeError, ValueError):
                    raise WorkloadError(f"{where} = {column!r} in '{path}' line {line}: {row[column]!r} is not a number") from None
                if not (math.isfinite(value) and 0 <= value <= MAX_TOKENS):
                    raise WorkloadError(f"{where} = {column!r} in '{path}' line {line}: {value!r} must be a finite "
                                        f"token count in [0, {MAX_TOKENS:,}]")
                values.append(round(value))
            return tuple(values)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{where}: '{path}' is not UTF-8 text (byte {exc.start}); save it as UTF-8 CSV") from None
    except csv.Error as exc:
        raise WorkloadError(f"{where}: '{path}' is not a well-formed CSV: {exc}") from None


def parse_workload(table: Mapping[str, Any], base_dir: Path | None = None) -> WorkloadSpec:
    """Validate the ``[workload]`` TOML table; relative file paths resolve against ``base_dir``."""
    unknown = sorted(set(table) - set(_WORKLOAD_KEYS))
    if unknown:
        raise WorkloadError(f"workload: unknown keys {unknown}; allowed: {', '.join(_WORKLOAD_KEYS)}")
    fields: dict[str, Any] = {}
    for key in ("rate_per_s", "burstiness", "time_scale"):
        if key in table:
            fields[key] = _number(table, key, "workload")
    for key in ("num_requests", "shared_prefix_tokens", "prefix_block_tokens", "seed"):
        if key in table:
            fields[key] = _number(table, key, "workload", integer=True)
    if "arrival" in table:
        fields["arrival"] = table["arrival"]
    for key in ("prompt_tokens", "output_tokens"):
        if key in table:
            fields[key] = parse_length(table[key], f"workload.{key}", base_dir)
    output = fields.get("output_tokens")
    if output is not None and _largest(output) > MAX_OUTPUT_TOKENS:
        raise WorkloadError(
            f"workload.output_tokens reaches {_largest(output):,} tokens, past the limit of {MAX_OUTPUT_TOKENS:,} "
            "(one engine step per output token; no served model generates more)"
        )
    if "trace" in table:
        fields["trace"] = str(_resolve(table["trace"], base_dir, "workload.trace"))
    if "sessions" in table:
        fields["sessions"] = _parse_sessions(table["sessions"], base_dir)
    return WorkloadSpec(**fields)


def _parse_sessions(table: Any, base_dir: Path | None) -> SessionSpec:
    if not isinstance(table, Mapping):
        raise WorkloadError(f"workload.sessions = {table!r} must be a table with {', '.join(_SESSION_KEYS)}")
    unknown = sorted(set(table) - set(_SESSION_KEYS))
    if unknown:
        raise WorkloadError(f"workload.sessions: unknown keys {unknown}; allowed: {', '.join(_SESSION_KEYS)}")
    for key in ("turns", "think_time_s"):
        if key not in table:
            raise WorkloadError(f"workload.sessions.{key} is required")
    limit = table.get("max_context_tokens")
    if limit is not None:
        limit = _number(table, "max_context_tokens", "workload.sessions", integer=True)
    return SessionSpec(
        turns=parse_length(table["turns"], "workload.sessions.turns", base_dir),
        think_time_s=_number(table, "think_time_s", "workload.sessions"),
        max_context_tokens=limit,
    )


# ---------------------------------------------------------------- generation


def arrival_times_s(arrival: str, count: int, rate_per_s: float | None, burstiness: float,
                    rng: np.random.Generator) -> np.ndarray:
    """``count`` sorted arrival times (s), the first at 0, for a synthetic arrival process."""
    if arrival == "offline":
        return np.zeros(count)
    if rate_per_s is None or not rate_per_s > 0:
        raise WorkloadError(f"workload.rate_per_s = {rate_per_s!r} must be a positive number")
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate_per_s, size=count - 1)
    elif arrival == "gamma":
        gaps = rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), size=count - 1)
    else:
        raise WorkloadError(f"workload.arrival = {arrival!r} is not synthetic; allowed: poisson, gamma, offline")
    return np.concatenate(([0.0], np.cumsum(gaps)))


def _block_hashes(prompt_tokens: int, shared_tokens: int, block_tokens: int, owner: int) -> tuple[int, ...]:
    full = prompt_tokens // block_tokens
    shared = min(shared_tokens // block_tokens, full)
    base = (owner + 1) * _OWNER_STRIDE
    return tuple(range(-1, -shared - 1, -1)) + tuple(range(base + shared, base + full))


def build_requests(spec: WorkloadSpec, rng: np.random.Generator) -> list[RequestSpec]:
    """The stream's requests sorted by arrival, ids 0..n-1; every draw comes from ``rng``."""
    if spec.arrival == "trace":
        return _trace_requests(spec, rng)
    if spec.sessions is not None:
        return _session_requests(spec, spec.sessions, rng)
    n = spec.num_requests
    arrivals = arrival_times_s(spec.arrival, n, spec.rate_per_s, spec.burstiness, rng)  # type: ignore[arg-type]
    prompts = spec.prompt_tokens.sample(rng, n) + spec.shared_prefix_tokens  # type: ignore[union-attr]
    outputs = spec.output_tokens.sample(rng, n)  # type: ignore[union-attr]
    block = spec.prefix_block_tokens
    return [
        RequestSpec(
            request_id=i, arrival_s=float(arrivals[i]), prompt_tokens=int(prompts[i]), output_tokens=int(outputs[i]),
            prefix_hashes=_block_hashes(int(prompts[i]), spec.shared_prefix_tokens, block, i)
            if spec.shared_prefix_tokens else (),
            prefix_block_tokens=block,
        )
        for i in range(n)  # type: ignore[arg-type]
    ]


def _session_requests(spec: WorkloadSpec, sessions: SessionSpec, rng: np.random.Generator) -> list[RequestSpec]:
    # Each session has >= 1 turn, so the first n session starts already hold n requests: sessions
    # after the n-th start later than n requests and cannot be among the n earliest.
    n = spec.num_requests
    starts = arrival_times_s(spec.arrival, n, spec.rate_per_s, spec.burstiness, rng)  # type: ignore[arg-type]
    turns = sessions.turns.sample(rng, n)  # type: ignore[arg-type]
    total = int(turns.sum())
    if total > 10 * MAX_NUM_REQUESTS:
        raise WorkloadError(
            f"workload.sessions.turns: {n:,} sessions hold {total:,} turns, past the limit of {10 * MAX_NUM_REQUESTS:,}"
        )
    think = rng.exponential(sessions.think_time_s, size=total) if sessions.think_time_s > 0 else np.zeros(total)
    users = spec.prompt_tokens.sample(rng, total)  # type: ignore[union-attr]
    outputs = spec.output_tokens.sample(rng, total)  # type: ignore[union-attr]
    rows: list[tuple[float, int, int, int, int]] = []  # (arrival, session, turn, prompt, output)
    k = 0
    for session in range(n):  # type: ignore[arg-type]
        arrival, context = float(starts[session]), spec.shared_prefix_tokens
        for turn in range(int(turns[session])):
            if turn:
                arrival += float(think[k])
            prompt = context + int(users[k])
            output = int(outputs[k])
            k += 1
            if turn and sessions.max_context_tokens is not None and prompt + output > sessions.max_context_tokens:
                k += int(turns[session]) - turn - 1
                break
            rows.append((arrival, session, turn, prompt, output))
            context = prompt + output
    rows.sort()
    block = spec.prefix_block_tokens
    return [
        RequestSpec(
            request_id=i, arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, session_id=session,
            prefix_hashes=_block_hashes(prompt, spec.shared_prefix_tokens, block, session), prefix_block_tokens=block,
        )
        for i, (arrival, session, _, prompt, output) in enumerate(rows[:n])  # type: ignore[index]
    ]


def _trace_requests(spec: WorkloadSpec, rng: np.random.Generator) -> list[RequestSpec]:
    requests = read_trace(spec.trace, limit=spec.num_requests)  # type: ignore[arg-type]
    n = len(requests)
    arrivals = np.array([r.arrival_s for r in requests])
    scale = spec.time_scale
    if spec.rate_per_s is not None:
        span_s = float(arrivals[-1] - arrivals[0])
        if n < 2 or span_s <= 0:
            raise WorkloadError(f"workload.rate_per_s cannot rescale trace '{spec.trace}': its {n} requests span 0 s")
        scale = ((n - 1) / span_s) / spec.rate_per_s
    if scale is not None:
        arrivals = arrivals * scale
    prompts = spec.prompt_tokens.sample(rng, n) if spec.prompt_tokens else None
    outputs = spec.output_tokens.sample(rng, n) if spec.output_tokens else None
    result = []
    for i, r in enumerate(requests):
        prompt = int(prompts[i]) if prompts is not None else r.prompt_tokens
        hashes = r.prefix_hashes[: prompt // r.prefix_block_tokens]
        result.append(RequestSpec(
            request_id=i, arrival_s=float(arrivals[i]), prompt_tokens=prompt,
            output_tokens=int(outputs[i]) if outputs is not None else r.output_tokens,
            session_id=r.session_id, prefix_hashes=hashes, prefix_block_tokens=r.prefix_block_tokens,
        ))
    return result


def read_trace(path: str | Path, *, limit: int | None = None) -> list[RequestSpec]:
    """Requests of a trace file, sorted by arrival (t = 0 at the earliest), ids 0..n-1.

    CSV with columns ``arrived_at,num_prefill_tokens,num_decode_tokens`` (seconds) or the original
    Azure ``TIMESTAMP,ContextTokens,GeneratedTokens`` (date-times or seconds); JSONL (``.jsonl``)
    with ``timestamp`` (ms), ``input_length``, ``output_length`` and optional ``hash_ids``
    (512-token blocks, truncated to the prompt's full blocks) and ``session_id``/``chat_id``, as the
    Mooncake traces. ``limit`` keeps the first rows of the file. Rows with a zero-token prompt or
    output are kept with the count raised to 1 (a request always has one of each).
    """
    file = Path(path)
    if file.is_dir():
        raise WorkloadError(f"workload.trace = '{path}' is a folder, not a trace file")
    if not file.is_file():
        raise WorkloadError(f"workload.trace = '{path}': file not found")
    if limit is not None and limit < 1:
        raise WorkloadError(f"workload.num_requests = {limit} must be >= 1")
    rows = read_trace_rows(file, limit)
    if not rows:
        raise WorkloadError(f"workload.trace = '{path}' has no requests")
    rows.sort(key=lambda row: row[0])
    start_s = rows[0][0]
    return [
        RequestSpec(
            request_id=i, arrival_s=arrival - start_s, prompt_tokens=max(1, prompt), output_tokens=max(1, output),
            session_id=session, prefix_hashes=hashes[: max(1, prompt) // block], prefix_block_tokens=block,
        )
        for i, (arrival, prompt, output, session, hashes, block) in enumerate(rows)
    ]
