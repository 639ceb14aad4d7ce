"""The ``llmsim`` command line (also ``python -m sim``).

Exit codes: 0 ok; 1 validation threshold exceeded or no feasible plan; 2 bad input, reported as one
``error: ...`` line on stderr. This module is the one place allowed to import ``search`` and
``validation``, lazily, inside the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hardware.errors import CatalogError
from sim import __version__
from sim.errors import ConfigError
from sim.jsonout import dumps
from workloads.errors import InvalidPlanError, ModelCatalogError, WorkloadError

# Errors that mean "bad input": one line, exit 2.
INPUT_ERRORS = (ConfigError, CatalogError, ModelCatalogError, InvalidPlanError, WorkloadError)


class UsageError(Exception):
    """argparse usage errors, re-raised so they follow the one-line error convention."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llmsim", description="Performance simulator and planner for LLM training and serving.")
    parser.add_argument("--version", action="version", version=f"llmsim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    catalog = commands.add_parser("catalog", help="list or show hardware and model catalog entries")
    catalog_kind = catalog.add_subparsers(dest="kind", required=True, parser_class=_Parser)
    for kind in ("gpus", "nodes", "networks", "models"):
        _add_format(catalog_kind.add_parser(kind, help=f"list the {kind}"))
    show = catalog_kind.add_parser("show", help="one entry (GPU, node, network or model), all fields with units")
    show.add_argument("name")
    _add_format(show)

    simulate = commands.add_parser("simulate", help="one training or serving run from a TOML config")
    simulate.add_argument("config", help="TOML file with [model], [cluster] and [training] or [serving]")
    simulate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (dotted), repeatable")
    simulate.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...", help="one run per value of KEY (once per run)")
    simulate.add_argument("--fidelity", choices=("analytic", "des"), default="des", help="analytic (closed form) or des (SimPy, default)")
    simulate.add_argument("--seed", type=int, default=None, help="random seed; overrides [workload] seed (default: that, else 0)")
    simulate.add_argument("--out", metavar="DIR", help="write CSV results and run.json here")
    simulate.add_argument("--trace", nargs="?", const="", metavar="FILE",
                          help="write a Chrome/Perfetto trace JSON (default: DIR/trace.json with --out, else trace.json)")
    simulate.add_argument("-v", "--verbose", action="store_true", help="print the resolved config and where the time goes (stderr)")
    _add_format(simulate)

    search = commands.add_parser("search", help="search plans, serving fleets or offload placements ([search] in the config)")
    search.add_argument("config", help="TOML file with [model], [cluster] and [search] (plus [training] or [workload]/[slo])")
    search.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (dotted), repeatable")
    search.add_argument("--top", type=int, metavar="K", help="candidates re-ranked with the DES (default: [search] top_k, else 10)")
    search.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: all cores)")
    search.add_argument("--dask", metavar="ADDRESS", help="evaluate candidates on this dask.distributed scheduler")
    search.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    search.add_argument("--out", metavar="DIR", help="write candidates, Pareto set, plots and the best config here")
    search.add_argument("-v", "--verbose", action="store_true")
    _add_format(search)

    validate = commands.add_parser("validate", help="compare predictions with the bundled published results")
    validate.add_argument("--suite", choices=("training", "serving", "all", "training-modern", "training-pairs",
                                              "serving-trtllm-0.14", "serving-nanoflow"), default="all")
    validate.add_argument("--fidelity", choices=("analytic", "des"), default="des")
    validate.add_argument("-v", "--verbose", action="store_true", help="print each row's config (TOML for `llmsim simulate`)")
    _add_format(validate)
    from validation.calibration.commands import add_calibrate_parser, add_measurement_arguments

    add_measurement_arguments(validate)
    add_calibrate_parser(commands, _Parser, _add_format)
    return parser


# ---- catalog --------------------------------------------------------------------------------------


def _cmd_catalog(args: argparse.Namespace) -> int:
    from sim import catalog_view

    if args.kind == "show":
        entry = catalog_view.find_entry(args.name)
        if args.format == "json":
            print(dumps(catalog_view.entry_json(entry)))
        else:
            print(catalog_view.entry_table(entry))
        return 0
    if args.format == "json":
        print(dumps({args.kind: catalog_view.list_json(args.kind)}))
    else:
        print(catalog_view.list_table(args.kind))
    return 0


# ---- simulate -------------------------------------------------------------------------------------


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _write_run_json(out_dir: Path, config: dict[str, Any], seed: int | None, fidelity: str) -> None:
    from sim import notices
    meta = {"config": config, "seed": seed, "fidelity": fidelity, "version": __version__,
            "git_revision": _git_revision(), "warnings": notices.issued()}
    (out_dir / "run.json").write_text(dumps(meta, indent=2, default=str) + "\n")


def _parse_sweep(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise ConfigError(f"--sweep '{text}' must look like section.key=V1,V2,...")
    return key.strip(), items


def _cmd_simulate(args: argparse.Namespace) -> int:
    from sim import notices
    from sim.cli_support import (
        check_sections, comparison_lines, prepare_outputs, published_comparison, reference_lines, resolved_config,
        verbose_report,
    )
    from sim.config import load_config, read_toml, with_overrides
    from sim.runner import RunOptions, simulate

    notices.reset()
    if args.sweep and len(args.sweep) > 1:
        raise ConfigError(f"--sweep given {len(args.sweep)} times ({', '.join(args.sweep)}); one --sweep per run")
    sweep_arg = args.sweep[0] if args.sweep else None
    if sweep_arg is not None and args.trace is not None:
        raise ConfigError("--trace writes the trace of one run; it cannot be combined with --sweep")
    kind = check_sections(read_toml(args.config, "config file"), [*args.set, *([sweep_arg] if sweep_arg else [])])
    config = load_config(args.config, args.set)
    if kind == "serving" and args.fidelity == "analytic":
        notices.warn("--fidelity analytic: serving runs always use the event-driven engine; the option is ignored")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"--seed {args.seed} must be >= 0")
    out_dir, trace_path = prepare_outputs(args.out, args.trace)
    options = RunOptions(
        fidelity=args.fidelity,
        seed=args.seed,
        trace=trace_path is not None,
        verbose=args.verbose,
        config_dir=Path(args.config).resolve().parent,
    )
    if sweep_arg is not None:
        from sim import sweep

        key, values = _parse_sweep(sweep_arg)
        results = [(value, simulate(with_overrides(config, [f"{key}={value}"]), options)) for value in values]
        frame = sweep.sweep_frame(key, results)
        if args.format == "json":
            from sim.config import parse_value  # the value as --set applies it: 16, not "16"

            print(dumps({"sweep": key, "runs": [{"value": parse_value(v), "metrics": r.metrics()} for v, r in results]}))
        else:
            print(sweep.sweep_table(frame))
        if out_dir is not None:
            sweep.write_sweep(out_dir, key, frame, results[0][1].sweep_metrics(), reference_lines(results[0][1]))
            first = resolved_config(config, results[0][1], getattr(results[0][1], "seed", args.seed), options.config_dir)
            _write_run_json(out_dir, first, getattr(results[0][1], "seed", args.seed), args.fidelity)
        return 0
    result = simulate(config, options)
    seed = getattr(result, "seed", args.seed)
    resolved = resolved_config(config, result, seed, options.config_dir)
    comparison = published_comparison(config, result)
    if args.verbose:
        verbose_report(result, resolved)
    if args.format == "json":
        print(dumps({**result.metrics(), **({"published": comparison} if comparison else {})}))
    else:
        print("\n".join([result.table(), *(comparison_lines(comparison) if comparison else [])]))
    if out_dir is not None:
        result.write_outputs(out_dir)
        _write_run_json(out_dir, resolved, seed, args.fidelity)
    if trace_path is not None:
        result.write_trace(trace_path)
    return 0


# ---- search ---------------------------------------------------------------------------------------


def _cmd_search(args: argparse.Namespace) -> int:
    from search.executor import default_workers
    from search.run import SearchOptions, run_search
    from sim.config import load_config

    config = load_config(args.config, args.set)
    options = SearchOptions(
        top_k=args.top,
        workers=args.workers if args.workers is not None else default_workers(),
        dask_address=args.dask,
        seed=args.seed,
        verbose=args.verbose,
        config_dir=Path(args.config).resolve().parent,
    )
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    result = run_search(config, options)
    if args.format == "json":
        print(dumps(result.to_json()))
    else:
        print(result.table())
    if out_dir is not None:
        result.write_outputs(out_dir)
        _write_run_json(out_dir, config, args.seed, "search")
    return 0 if result.feasible else 1


# ---- validate -------------------------------------------------------------------------------------


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.measurements:
        from validation.calibration.commands import cmd_validate_measurements

        return cmd_validate_measurements(args, dumps)
    from validation.published import run_suites

    report = run_suites(args.suite, fidelity=args.fidelity, calibration=args.calibration)
    if args.format == "json":
        print(dumps(report.to_json()))
    else:
        print(report.table(verbose=args.verbose))
    return 0 if report.passed else 1


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from validation.calibration.commands import cmd_calibrate

    return cmd_calibrate(args, dumps)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "calibrate": _cmd_calibrate,
    "catalog": _cmd_catalog,
    "simulate": _cmd_simulate,
    "search": _cmd_search,
    "validate": _cmd_validate,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except INPUT_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
