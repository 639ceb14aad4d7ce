"""The TOML writer for the configs the planners emit (best.toml): ``sim.toml_writer.dumps`` (the one
writer; ``llmsim validate -v`` prints row configs with it too) under the planner's name."""

from __future__ import annotations

from sim.toml_writer import dumps as dumps_toml

__all__ = ["dumps_toml"]
