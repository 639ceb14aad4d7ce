"""Chrome/Perfetto trace and pipeline timeline plot of a simulated training iteration.

Times inside llmsim are seconds; the Chrome trace format wants microseconds, converted here only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sim.training.pipeline_des import TraceEvent

# Chrome trace "ts"/"dur" unit: 1 s = 1e6 us (the inverse of hardware.units.us); a product keeps
# round values exact where dividing by 1e-6 would not (0.1 / 1e-6 = 100000.00000000001).
MICROSECONDS_PER_SECOND = 1e6
# Thread ids of the streams of a stage; the names are attached with "thread_name" metadata events.
STREAM_TIDS = {"compute": 0, "comm-dp": 1, "p2p": 2}
KIND_COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#c44e52", "optimizer": "#8172b2"}


def chrome_trace(
    events: Iterable[TraceEvent], memory_timeline: Sequence[Sequence[tuple[float, float]]] = ()
) -> dict[str, Any]:
    """A Chrome/Perfetto JSON object: one "X" event per interval (pid = stage, tid = stream) and one
    "C" counter series of activation bytes per stage from ``memory_timeline[stage]``."""
    trace: list[dict[str, Any]] = []
    tids = dict(STREAM_TIDS)  # other stream names get the next free ids, in order of appearance
    stages: set[int] = set()
    threads: set[tuple[int, str]] = set()
    for event in events:
        stages.add(event.stage)
        threads.add((event.stage, event.stream))
        tid = tids.setdefault(event.stream, len(tids))
        trace.append(
            {
                "ph": "X",
                "name": event.name,
                "cat": event.stream,
                "pid": event.stage,
                "tid": tid,
                "ts": event.start_s * MICROSECONDS_PER_SECOND,
                "dur": (event.end_s - event.start_s) * MICROSECONDS_PER_SECOND,
                "args": dict(event.args),
            }
        )
    for stage, timeline in enumerate(memory_timeline):
        stages.add(stage)
        for time_s, held_bytes in timeline:
            trace.append(
                {
                    "ph": "C",
                    "name": "activation memory",
                    "pid": stage,
                    "ts": time_s * MICROSECONDS_PER_SECOND,
                    "args": {"activation_bytes": held_bytes},
                }
            )
    metadata: list[dict[str, Any]] = []
    for stage in sorted(stages):
        metadata.append({"ph": "M", "name": "process_name", "pid": stage, "args": {"name": f"stage {stage}"}})
        metadata.append({"ph": "M", "name": "process_sort_index", "pid": stage, "args": {"sort_index": stage}})
    for stage, stream in sorted(threads):
        metadata.append({"ph": "M", "name": "thread_name", "pid": stage, "tid": tids[stream], "args": {"name": stream}})
    return {"traceEvents": metadata + trace, "displayTimeUnit": "ms"}


def write_chrome_trace(
    path: str | Path, events: Iterable[TraceEvent], memory_timeline: Sequence[Sequence[tuple[float, float]]] = ()
) -> Path:
    """Write ``chrome_trace(events, memory_timeline)`` as JSON to ``path``; returns the path."""
    target = Path(path)
    target.write_text(json.dumps(chrome_trace(events, memory_timeline)))
    return target


KIND_NAMES = {"F": "F: forward", "B": "B: backward (input gradients)", "W": "W: backward (weight gradients)"}


def plot_pipeline_timeline(events: Iterable[TraceEvent], path: str | Path, *, max_microbatches: int = 8,
                           total_microbatches: int | None = None) -> Path:
    """Gantt chart (PNG, Agg backend) of the F/B/W ops of micro-batches 0..max_microbatches-1 per stage.

    Bars are coloured by kind and labelled with the micro-batch number (``mb.chunk`` with
    interleaving); the time axis is in milliseconds. Returns the path.
    """
    if max_microbatches < 1:
        raise ValueError(f"max_microbatches = {max_microbatches} must be >= 1")
    ops = [
        e
        for e in events
        if e.stream == "compute" and e.args.get("kind") in ("F", "B", "W") and e.args["microbatch"] < max_microbatches
    ]
    stages = sorted({e.stage for e in ops})
    figure = Figure(figsize=(12.0, 0.45 * max(len(stages), 2) + 1.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    ms_per_s = 1e3  # display unit only
    end_ms = max((e.end_s for e in ops), default=0.0) * ms_per_s
    for kind in ("F", "B", "W"):
        for stage in stages:
            bars = [
                (e.start_s * ms_per_s, (e.end_s - e.start_s) * ms_per_s)
                for e in ops
                if e.stage == stage and e.args["kind"] == kind
            ]
            if bars:
                axes.broken_barh(
                    bars, (stage - 0.4, 0.8), facecolors=KIND_COLOURS[kind], edgecolor="white", linewidth=0.5,
                    label=KIND_NAMES[kind] if stage == stages[0] else None,
                )
    for e in ops:
        width_ms = (e.end_s - e.start_s) * ms_per_s
        if end_ms > 0.0 and width_ms > 0.012 * end_ms:  # label only bars wide enough to read
            label = e.name[1:]  # "3", or "3.c1" with interleaving
            axes.text((e.start_s * ms_per_s) + width_ms / 2, e.stage, label, ha="center", va="center", fontsize=6, color="white")
    # the steady state starts with the first backward on stage 0 (one F and one B per slot from then on)
    first_backward = min((e.start_s for e in ops if e.stage == stages[0] and e.args["kind"] == "B"), default=None) if stages else None
    if first_backward is not None:
        axes.axvline(first_backward * ms_per_s, color="black", linestyle="--", linewidth=0.8, label="steady state starts")
    axes.set_yticks(stages, [f"stage {s}" for s in stages])
    axes.invert_yaxis()
    axes.set_xlabel("time (ms)")
    drawn = f"micro-batches 0..{max_microbatches - 1}"
    if total_microbatches is not None:
        drawn += f" of {total_microbatches}" + (" (all)" if max_microbatches >= total_microbatches else "")
    axes.set_title(f"pipeline timeline, {drawn} (wide bars carry their micro-batch number)", fontsize=9)
    if ops:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target, format="png", dpi=120)
    return target
