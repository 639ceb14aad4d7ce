"""Accuracy of the cost model against measurements (``llmsim validate --measurements``).

Per op kind: median, mean and p90 absolute percentage error (as fractions) and the worst rows, for
the analytic defaults and, when a profile is given or fitted on a training split (``--holdout F``:
a seeded random fraction F of the rows is held out, the rest fitted), for the calibrated model on
the held-out rows. Every prediction goes through the cost functions simulations use
(``validation.calibration.predict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hardware.calibration import CalibrationProfile
from hardware.catalog import get_gpu
from hardware.errors import CatalogError
from validation.calibration.fit import fit_profile, select_stacks
from validation.calibration.predict import KINDS, Predictor, kind_of, with_profile
from validation.microbench.schema import MeasurementError

WORST_ROWS = 5
ROW_COLUMNS = ("op", "precision", "m", "n", "k", "batch", "seq_len", "kv_len", "heads", "kv_heads", "head_dim", "num_gpus", "message_bytes", "bytes")


def error_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    ape = np.abs(predicted / measured - 1.0)
    return {"n": int(len(ape)), "median_ape": float(np.median(ape)), "mean_ape": float(np.mean(ape)), "p90_ape": float(np.quantile(ape, 0.9))}


@dataclass
class MeasurementReport:
    gpu: str
    rows: int
    evaluated_rows: int
    not_modelled: dict[str, int]
    analytic: dict[str, dict[str, float]]
    calibrated: dict[str, dict[str, float]]
    worst: dict[str, list[dict[str, Any]]]
    holdout: float | None
    seed: int | None
    calibration: str | None
    stacks: str
    max_median_error: float | None
    plots: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        if self.max_median_error is None:
            return True
        model = self.calibrated or self.analytic
        return all(stats["median_ape"] <= self.max_median_error for stats in model.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "rows": self.rows, "evaluated_rows": self.evaluated_rows,
            "not_modelled": self.not_modelled, "holdout": self.holdout, "seed": self.seed,
            "calibration": self.calibration, "stacks": self.stacks, "analytic": self.analytic,
            "calibrated": self.calibrated, "worst": self.worst,
            "max_median_error": self.max_median_error, "passed": self.passed,
        }

    def table(self) -> str:
        split = f", held out {self.holdout:g} of the rows (seed {self.seed}), fitted on the rest" if self.holdout else ""
        lines = [f"measurements on {self.gpu}: {self.evaluated_rows} of {self.rows} rows evaluated{split}"]
        if self.calibration:
            lines.append(f"calibration: {self.calibration}")
        lines.append(f"stacks: {self.stacks}")
        header = f"{'kind':<18} {'n':>7} {'analytic median/mean/p90':>27}"
        if self.calibrated:
            header += f" {'calibrated median/mean/p90':>29}"
        lines.append(header)
        for kind, stats in self.analytic.items():
            line = f"{kind:<18} {stats['n']:>7} {_pct(stats):>27}"
            if self.calibrated:
                line += f" {_pct(self.calibrated[kind]) if kind in self.calibrated else '-':>29}"
            lines.append(line)
        for kind, count in self.not_modelled.items():
            lines.append(f"{kind:<18} {count:>7} not modelled (no single llmsim cost function or precision)")
        for kind, rows in self.worst.items():
            lines.append(f"worst {kind}: " + "; ".join(f"{r['shape']} measured {r['measured_s'] * 1e6:.4g} us predicted {r['predicted_s'] * 1e6:.4g} us ({r['error']:+.1%})" for r in rows[:3]))
        if self.max_median_error is not None:
            lines.append(f"max median error {self.max_median_error:g}: {'passed' if self.passed else 'FAILED'}")
        return "\n".join(lines)

    def write_plots(self, out_dir: str | Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for kind, (measured, analytic, calibrated) in self.plots.items():
            fig, ax = plt.subplots(figsize=(5, 5))
            ax.loglog(measured, analytic, ".", ms=2, alpha=0.4, label="analytic")
            if calibrated is not None:
                ax.loglog(measured, calibrated, ".", ms=2, alpha=0.4, label="calibrated")
            lo, hi = float(np.min(measured)), float(np.max(measured))
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.set_xlabel("measured s")
            ax.set_ylabel("predicted s")
            ax.set_title(f"{self.gpu}: {kind}")
            ax.legend()
            path = out / f"scatter_{kind}.png"
            fig.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(fig)
            written.append(path)
        return written


def _pct(stats: dict[str, float]) -> str:
    return f"{stats['median_ape']:.1%} / {stats['mean_ape']:.1%} / {stats['p90_ape']:.1%}"


def _shape(row: pd.Series) -> str:
    return " ".join(f"{c}={row[c]}" for c in ROW_COLUMNS if c in row and not pd.isna(row[c]))


def measurement_gpu(frame: pd.DataFrame, gpu: str | None) -> str:
    if gpu:
        return gpu
    names = sorted(set(frame["gpu"].dropna()))
    if len(names) != 1:
        raise MeasurementError(
            f"measurements name {len(names)} catalog GPUs ({', '.join(names) or 'none'}) in column 'gpu'; give --gpu NAME"
        )
    return names[0]


def measurement_report(
    frame: pd.DataFrame, *, gpu: str | None = None, calibration: CalibrationProfile | None = None,
    holdout: float | None = None, seed: int = 0, framework: str | None = None,
    max_median_error: float | None = None,
) -> MeasurementReport:
    """Analytic and calibrated errors per op kind (see the module docstring)."""
    if holdout is not None and not 0.0 < holdout < 1.0:
        raise MeasurementError(f"--holdout {holdout}: must be a fraction strictly between 0 and 1")
    if seed < 0:
        raise MeasurementError(f"--seed {seed}: must be >= 0 (it seeds the holdout split)")
    if max_median_error is not None and not 0.0 <= max_median_error < float("inf"):
        raise MeasurementError(f"--max-median-error {max_median_error}: must be a finite fraction >= 0 (0.1 = 10 %)")
    name = measurement_gpu(frame, gpu)
    try:
        spec = get_gpu(name)
    except CatalogError as exc:
        raise MeasurementError(f"--gpu: {exc}") from None
    total_rows = len(frame)
    frame = select_stacks(frame, framework).reset_index(drop=True)
    test = np.ones(len(frame), dtype=bool)
    label = calibration.path or calibration.source if calibration is not None else None
    if holdout is not None:
        rng = np.random.default_rng(seed)
        test = rng.random(len(frame)) < holdout
        calibration = fit_profile(frame[~test], spec, framework=framework, source=f"fit on {int((~test).sum())} rows")
        label = f"fitted on the {int((~test).sum())} training rows"
    rows = frame[test].reset_index(drop=True)
    measured = rows["latency_s"].to_numpy()
    analytic_s, _ = Predictor(with_profile(spec, None)).predict(rows)
    calibrated_s = Predictor(with_profile(spec, calibration)).predict(rows)[0] if calibration is not None else None
    kinds = rows["op"].map(kind_of).to_numpy()
    analytic: dict[str, dict[str, float]] = {}
    calibrated: dict[str, dict[str, float]] = {}
    worst: dict[str, list[dict[str, Any]]] = {}
    not_modelled: dict[str, int] = {}
    plots = {}
    evaluated = 0
    for kind in [k for k in KINDS if k in set(kinds)] + sorted(set(kinds) - set(KINDS)):
        mask = (kinds == kind) & np.isfinite(analytic_s)
        missing = int(((kinds == kind) & ~np.isfinite(analytic_s)).sum())
        if missing:
            not_modelled[kind] = missing
        if not mask.any():
            continue
        evaluated += int(mask.sum())
        analytic[kind] = error_stats(analytic_s[mask], measured[mask])
        best = calibrated_s if calibrated_s is not None else analytic_s
        if calibrated_s is not None:
            calibrated[kind] = error_stats(calibrated_s[mask], measured[mask])
        errors = best[mask] / measured[mask] - 1.0
        order = np.argsort(-np.abs(errors))[:WORST_ROWS]
        part = rows[mask].reset_index(drop=True)
        worst[kind] = [
            {"shape": _shape(part.iloc[i]), "measured_s": float(measured[mask][i]), "predicted_s": float(best[mask][i]), "error": float(errors[i])}
            for i in order
        ]
        plots[kind] = (measured[mask], analytic_s[mask], calibrated_s[mask] if calibrated_s is not None else None)
    from validation.calibration.fit import stack_label

    return MeasurementReport(
        gpu=name, rows=total_rows, evaluated_rows=evaluated, not_modelled=not_modelled, analytic=analytic,
        calibrated=calibrated, worst=worst, holdout=holdout, seed=seed if holdout is not None else None,
        calibration=label, stacks=stack_label(frame), max_median_error=max_median_error, plots=plots,
    )
