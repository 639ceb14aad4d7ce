"""The published-results suites: predicted vs published per row, summary errors, pass/fail.

Each suite lives in its own module and returns a ``SuiteReport``; thresholds are declared next to
the suite and the report fails when any is exceeded (a comparison that cannot fail is not a test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SUITES = ("training", "serving")
# one suite of the reports "training" / "serving" give, alone (`llmsim validate --suite NAME`)
SINGLE_SUITES = ("training-modern", "training-pairs", "serving-trtllm-0.14", "serving-nanoflow")


def _limit(fraction: float) -> str:
    """A threshold as a percentage with no more digits than it has (0.125 -> '12.5%', 0.15 -> '15%')."""
    return f"{fraction * 100:.4g}%"


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One predicted-vs-published number."""

    suite: str
    row: str  # a short label of the configuration
    metric: str  # e.g. "iteration_time_s", "output_tokens_per_s_per_gpu"
    published: float
    predicted: float
    citation: str
    excluded: str = ""  # why the row is reported but kept out of the threshold statistics ("" = counted)
    config: Mapping[str, Any] | None = None  # the `llmsim simulate` config the prediction ran (None: a memory-model check)
    fits_in_memory: bool = True  # the simulated run fits (a published run that ran must)

    @property
    def error(self) -> float:
        """Signed relative error (predicted - published) / published."""
        return (self.predicted - self.published) / self.published


@dataclass(frozen=True, slots=True, kw_only=True)
class Threshold:
    """A declared limit on a metric's errors: mean absolute percentage error and worst row."""

    metric: str
    max_mape: float
    max_row_error: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteReport:
    suite: str
    comparisons: tuple[Comparison, ...]
    thresholds: tuple[Threshold, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    require_fit: bool = True  # a row predicted not to fit fails the suite (else it is only marked)

    def rows(self, metric: str) -> list[Comparison]:
        """The rows of ``metric`` that the thresholds count (excluded rows are only reported)."""
        return [c for c in self.comparisons if c.metric == metric and not c.excluded]

    def mape(self, metric: str) -> float:
        rows = self.rows(metric)
        return sum(abs(c.error) for c in rows) / len(rows) if rows else 0.0

    def signed_mean(self, metric: str) -> float:
        rows = self.rows(metric)
        return sum(c.error for c in rows) / len(rows) if rows else 0.0

    def worst(self, metric: str) -> float:
        return max((abs(c.error) for c in self.rows(metric)), default=0.0)

    def failures(self) -> list[str]:
        out = [f"{self.suite}/{c.row}: predicted not to fit in memory, but the published run ran"
               for c in self.comparisons if not c.fits_in_memory and self.require_fit]
        for t in self.thresholds:
            if self.mape(t.metric) > t.max_mape:
                out.append(f"{self.suite}/{t.metric}: MAPE {self.mape(t.metric):.1%} > {_limit(t.max_mape)}")
            if self.worst(t.metric) > t.max_row_error:
                out.append(f"{self.suite}/{t.metric}: worst row {self.worst(t.metric):.1%} > {_limit(t.max_row_error)}")
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    suites: tuple[SuiteReport, ...]

    @property
    def passed(self) -> bool:
        return not any(s.failures() for s in self.suites)

    def table(self, verbose: bool = False) -> str:
        """Per-row errors and summaries; ``verbose`` adds each row's config as TOML (re-run it with
        ``llmsim simulate``)."""
        from sim.toml_writer import dumps

        lines = []
        for s in self.suites:
            lines.append(f"== {s.suite} ==")
            lines.append(f"{'row':<44} {'metric':<30} {'published':>12} {'predicted':>12} {'error':>8}")
            for c in s.comparisons:
                lines.append(
                    f"{c.row:<44} {c.metric:<30} {c.published:>12.4g} {c.predicted:>12.4g} {c.error:>+8.1%}"
                    + (f"  (not counted: {c.excluded})" if c.excluded else "")
                    + ("" if c.fits_in_memory else "  (predicted not to fit)")
                )
                if verbose and c.config is not None:
                    lines.extend("    " + line for line in dumps(c.config).splitlines())
            for t in s.thresholds:
                lines.append(
                    f"summary {t.metric}: MAPE {s.mape(t.metric):.1%} (limit {_limit(t.max_mape)}), "
                    f"worst {s.worst(t.metric):.1%} (limit {_limit(t.max_row_error)}), "
                    f"signed mean {s.signed_mean(t.metric):+.1%}"
                )
            lines.extend(f"note: {n}" for n in s.notes)
        failures = [f for s in self.suites for f in s.failures()]
        lines.append("PASS" if not failures else "FAIL: " + "; ".join(failures))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "suites": {
                s.suite: {
                    "rows": [
                        {
                            "row": c.row,
                            "metric": c.metric,
                            "published": c.published,
                            "predicted": c.predicted,
                            "error": c.error,
                            "citation": c.citation,
                            "excluded": c.excluded,
                            "fits_in_memory": c.fits_in_memory,
                            "config": c.config,
                        }
                        for c in s.comparisons
                    ],
                    "summary": {
                        t.metric: {
                            "mape": s.mape(t.metric),
                            "worst": s.worst(t.metric),
                            "max_mape": t.max_mape,
                            "max_row_error": t.max_row_error,
                        }
                        for t in s.thresholds
                    },
                    "failures": s.failures(),
                }
                for s in self.suites
            },
        }


def with_calibration(config: Mapping[str, Any], calibration: str | None) -> dict[str, Any]:
    """A row's config with ``[cluster] calibration = calibration`` (None: unchanged, every GPU
    priced with its shipped profile; "none": the analytic defaults alone)."""
    if calibration is None:
        return dict(config)
    return {**config, "cluster": {**config["cluster"], "calibration": calibration}}


def run_suites(name: str, fidelity: str = "des", calibration: str | None = None) -> Report:
    """Run ``name`` ("training", "serving", "all" or one of ``SINGLE_SUITES``); ``calibration`` as in
    ``with_calibration``."""
    if name in SINGLE_SUITES:
        from validation import pairs_suite, serving_suite, training_suite

        run = {"training-modern": lambda: training_suite.run_training_modern_suite(fidelity=fidelity, calibration=calibration),
               "training-pairs": lambda: pairs_suite.run_training_pairs_suite(fidelity=fidelity, calibration=calibration),
               "serving-trtllm-0.14": lambda: serving_suite.run_serving_inflight_suite(calibration=calibration),
               "serving-nanoflow": lambda: serving_suite.run_serving_nanoflow_suite(calibration=calibration)}[name]
        return Report(suites=(run(),))
    names = SUITES if name == "all" else (name,)
    reports = []
    for suite in names:
        if suite == "training":
            from validation.pairs_suite import run_training_pairs_suite
            from validation.training_suite import run_training_modern_suite, run_training_suite

            reports.append(run_training_suite(fidelity=fidelity, calibration=calibration))
            reports.append(run_training_modern_suite(fidelity=fidelity, calibration=calibration))
            reports.append(run_training_pairs_suite(fidelity=fidelity, calibration=calibration))
        else:
            from validation.serving_suite import run_serving_inflight_suite, run_serving_nanoflow_suite, run_serving_suite

            reports.append(run_serving_suite(calibration=calibration))
            reports.append(run_serving_inflight_suite(calibration=calibration))
            reports.append(run_serving_nanoflow_suite(calibration=calibration))
    return Report(suites=tuple(reports))
