"""``llmsim search``: read ``[search]``, dispatch to the planner of its ``goal``, and the result
protocol every planner returns (JSON of INTERFACE.md, a table, output files)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from sim.config import section
from sim.errors import ConfigError

# goal -> "module:function"; each function takes (config, SearchOptions) and returns a SearchResult
PLANNERS = {
    "training": "search.training:search_training",
    "fleet": "search.fleet:search_fleet",
    "offload": "search.offload:search_offload",
}
DEFAULT_TOP_K = 10
# [search] keys read here; each planner lists its own in a constant ending in _SEARCH_KEYS
# (docs/configuration.md is tested against the union: tests/test_docs_configuration.py).
SEARCH_KEYS = ("goal",)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """Command-line options of ``llmsim search`` (how to search, not what)."""

    top_k: int | None = None  # --top; None: [search] top_k, else DEFAULT_TOP_K
    workers: int = 1  # process-pool size (1: in this process)
    dask_address: str | None = None  # --dask: evaluate candidate batches on this dask scheduler
    seed: int = 0
    verbose: bool = False
    config_dir: Path | None = None  # folder of the config file: relative paths in it resolve here

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top {self.top_k} must be a positive integer")
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers} must be a positive integer")


class SearchResult(Protocol):
    """What every planner returns."""

    feasible: bool  # False: no plan met the constraints (exit 1; the table names the binding one)

    def to_json(self) -> dict[str, Any]:
        """The search JSON object of INTERFACE.md."""
        ...

    def table(self) -> str:
        """A human summary for stdout."""
        ...

    def write_outputs(self, out_dir: Path) -> list[Path]:
        """Write the CSVs, plots and the runnable best config into ``out_dir``; return the paths."""
        ...


def search_goal(config: Mapping[str, Any]) -> str:
    """``[search] goal`` (default "training"), checked against the planners that exist."""
    goal = section(config, "search").get("goal", "training")
    if not isinstance(goal, str) or goal not in PLANNERS:
        raise ConfigError(f"[search] goal = {goal!r} must be one of {', '.join(PLANNERS)}")
    return goal


def run_search(config: Mapping[str, Any], options: SearchOptions) -> SearchResult:
    """Run the planner that ``[search] goal`` names on ``config``."""
    module_name, function_name = PLANNERS[search_goal(config)].split(":")
    planner = getattr(importlib.import_module(module_name), function_name)
    return planner(config, options)
