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


TRAINING_COLUMNS = ("iteration_time_s", "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_bytes", "fits_in_memory")
SERVING_COLUMNS = (
    "request_throughput_per_s", "output_tokens_per_s", "ttft_s.p50", "ttft_s.p99", "tpot_s.p50",
    "goodput_requests_per_s", "slo_attainment", "saturated",
)
GiB = 2**30


def column_label(metric: str) -> str:
    """A column or axis label in words with its unit: ``ttft_s.p99`` -> ``TTFT p99 (s)``."""
    base, _, stat = metric.partition(".")
    words = {
        "iteration_time_s": "iteration time (s)", "tokens_per_s": "tokens/s", "tokens_per_s_per_gpu": "tokens/s per GPU",
        "mfu": "MFU (%)", "hfu": "HFU (%)", "bubble_fraction": "bubble (%)", "peak_memory_bytes": "peak memory per GPU (GiB)",
        "fits_in_memory": "fits", "request_throughput_per_s": "requests/s", "output_tokens_per_s": "output tokens/s",
        "total_tokens_per_s": "total tokens/s", "goodput_requests_per_s": "goodput (req/s)",
        "slo_attainment": "SLO attainment (%)", "saturated": "saturated",
        "ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E", "queue_s": "queue wait",
    }
    if stat:
        return f"{words.get(base, base)} {stat} (s)"
    return words.get(metric, metric)


def format_value(metric: str, value: Any) -> str:
    """One number format per column: seconds with fixed decimals, rates with thousands separators,
    memory in GiB, fractions in percent, booleans as yes/no."""
    if isinstance(value, bool) or (hasattr(value, "dtype") and str(getattr(value, "dtype", "")) == "bool"):
        return "yes" if value else "no"
    if not isinstance(value, int | float) or value != value:
        return "-" if value is None or value != value else str(value)
    if metric.endswith("_bytes"):
        return f"{value / GiB:,.2f}"
    if metric in ("mfu", "hfu", "bubble_fraction", "slo_attainment"):
        return f"{value * 100:.1f}"
    if metric in ("request_throughput_per_s", "goodput_requests_per_s"):
        return f"{value:,.3f}"
    if metric.endswith("_per_s") or metric.endswith("tokens_per_s_per_gpu"):
        return f"{value:,.0f}"
    if metric == "iteration_time_s":
        return f"{value:,.3f}"
    if "_s" in metric:
        return f"{value:.4f}"
    return f"{value:g}"


def sweep_table(frame: pd.DataFrame, metric_names: Sequence[str] | None = None) -> str:
    """A fixed-width table of the swept value and the main metrics present, one format per column."""
    key = frame.columns[0]
    default = SERVING_COLUMNS if "request_throughput_per_s" in frame.columns else TRAINING_COLUMNS
    names = [m for m in (metric_names or default) if m in frame.columns]
    header = [key, *(column_label(m) for m in names)]
    rows = [[str(row[key]), *(format_value(m, row[m]) for m in names)] for _, row in frame.iterrows()]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_sweep(out_dir: Path, key: str, frame: pd.DataFrame, metric_names: Sequence[str],
                lines: Mapping[str, tuple[float, str]] | None = None) -> list[Path]:
    """Write ``sweep.csv`` and one PNG per metric (against ``key``) into ``out_dir``; return the paths.
    ``lines``: metric -> (value, label) drawn as a horizontal line (the GPU capacity, an SLO limit)."""
    out_dir = Path(out_dir)
    csv_path = out_dir / "sweep.csv"
    frame.to_csv(csv_path, index=False)
    return [csv_path, *plot_sweep(csv_path, key, metric_names, out_dir, lines or {})]


def plot_sweep(csv_path: Path, key: str, metric_names: Sequence[str], out_dir: Path,
               lines: Mapping[str, tuple[float, str]] | None = None) -> list[Path]:
    """Plots of each metric column of the saved CSV against the swept column (matplotlib, Agg): a
    title, axis labels in words with units, memory in GiB, percentages for fractions, integer ticks
    for an integer key, and the capacity or SLO line where one applies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    frame = pd.read_csv(csv_path)
    lines = lines or {}
    paths: list[Path] = []
    for metric in metric_names:
        if metric not in frame.columns or not pd.api.types.is_numeric_dtype(frame[metric]) or frame[metric].dtype == bool:
            continue
        scale = 1 / GiB if metric.endswith("_bytes") else (100.0 if metric in ("mfu", "hfu", "bubble_fraction", "slo_attainment") else 1.0)
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        ax.plot(frame[key], frame[metric] * scale, marker="o", label=column_label(metric))
        if metric in lines:
            value, label = lines[metric]
            ax.axhline(value * scale, color="tab:red", linestyle="--", linewidth=1, label=label)
            ax.legend(fontsize=8)
        ax.set_xlabel(key)
        ax.set_ylabel(column_label(metric))
        ax.set_title(f"{column_label(metric)} against {key}", fontsize=10)
        if pd.api.types.is_integer_dtype(frame[key]):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"sweep_{metric.replace('.', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
