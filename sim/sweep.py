"""``simulate --sweep KEY=V1,V2,...``: one row of flattened metrics per swept value, as a table, a
CSV and (with ``--out``) matplotlib plots of the chosen metrics against the swept value. Plots read
the saved CSV, as STYLE.md asks (a separate step after the runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metric dicts as dotted scalar columns (``ttft_s.p99``); lists and None are dropped."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
    return out


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def sweep_frame(key: str, results: Sequence[tuple[str, Any]]) -> pd.DataFrame:
    """One row per (value, result): the swept value in column ``key``, then the flattened metrics."""
    rows = [{key: _number(str(value)), **flatten(result.metrics())} for value, result in results]
    return pd.DataFrame(rows)


def sweep_table(frame: pd.DataFrame, metric_names: Sequence[str] | None = None) -> str:
    """A fixed-width table of the swept value and the main metrics present."""
    key = frame.columns[0]
    default = (
        "request_throughput_per_s", "output_tokens_per_s", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
        "itl_s.p99", "e2e_s.p50", "goodput_requests_per_s", "slo_attainment", "saturated",
        "iteration_time_s", "tokens_per_s", "mfu", "peak_memory_bytes", "fits_in_memory",
    )
    names = [m for m in (metric_names or default) if m in frame.columns]
    return frame[[key, *names]].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def write_sweep(out_dir: Path, key: str, frame: pd.DataFrame, metric_names: Sequence[str]) -> list[Path]:
    """Write ``sweep.csv`` and one PNG per metric (against ``key``) into ``out_dir``; return the paths."""
    out_dir = Path(out_dir)
    csv_path = out_dir / "sweep.csv"
    frame.to_csv(csv_path, index=False)
    return [csv_path, *plot_sweep(csv_path, key, metric_names, out_dir)]


def plot_sweep(csv_path: Path, key: str, metric_names: Sequence[str], out_dir: Path) -> list[Path]:
    """Plots of each metric column of the saved CSV against the swept column (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.read_csv(csv_path)
    paths: list[Path] = []
    for metric in metric_names:
        if metric not in frame.columns or not pd.api.types.is_numeric_dtype(frame[metric]):
            continue
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(frame[key], frame[metric], marker="o")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"sweep_{metric.replace('.', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
