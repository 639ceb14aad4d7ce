"""One simulation run: dispatch a config to the training or the serving simulator, and the result
protocol both return (metrics as JSON, a human table, CSV outputs, a Chrome trace)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from sim.errors import ConfigError

FIDELITIES = ("analytic", "des")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Command-line options that shape a run (not the system being simulated)."""

    fidelity: str = "des"  # "analytic" | "des"
    seed: int | None = None  # --seed; None: the config's [workload] seed, else 0
    trace: bool = False  # collect trace events (costs memory; only when --trace is given)
    verbose: bool = False
    config_dir: Path | None = None  # folder of the config file: relative paths in it resolve here

    def __post_init__(self) -> None:
        if self.fidelity not in FIDELITIES:
            raise ConfigError(f"--fidelity '{self.fidelity}' must be one of {', '.join(FIDELITIES)}")


class RunResult(Protocol):
    """What ``simulate`` returns."""

    def metrics(self) -> dict[str, Any]:
        """The JSON object of INTERFACE.md (training or serving fields)."""
        ...

    def table(self) -> str:
        """A human summary for stdout."""
        ...

    def write_outputs(self, out_dir: Path) -> list[Path]:
        """Write the per-rank/op or per-request CSVs into ``out_dir``; return the paths written."""
        ...

    def write_trace(self, path: Path) -> None:
        """Write a Chrome/Perfetto trace (only valid when the run collected one)."""
        ...

    def sweep_metrics(self) -> list[str]:
        """Dotted metric names worth plotting against a swept parameter."""
        ...


def simulate(config: Mapping[str, Any], options: RunOptions) -> RunResult:
    """Run the training or serving simulation the config describes (exactly one of the two)."""
    has_training, has_serving = "training" in config, "serving" in config
    if has_training == has_serving:
        raise ConfigError("a config for `simulate` must hold exactly one of [training] or [serving]")
    if has_training:
        from sim.training.run import simulate_training

        return simulate_training(config, options)
    from sim.serving.run import simulate_serving

    return simulate_serving(config, options)
