"""``llmsim calibrate run|import|fit`` and ``llmsim validate --measurements`` (called lazily by
``sim.cli``, the only sim module allowed to import validation)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hardware.calibration import load_profile, profile_toml
from hardware.catalog import get_gpu
from hardware.errors import CatalogError
from validation.microbench.schema import MeasurementError, read_csv, write_csv


def add_calibrate_parser(commands, parser_class, add_format) -> None:
    calibrate = commands.add_parser("calibrate", help="measure this GPU, import published tables, fit calibration profiles")
    sub = calibrate.add_subparsers(dest="action", required=True, parser_class=parser_class)
    run = sub.add_parser("run", help="microbenchmarks on the local GPU (needs the calibrate extra: PyTorch)")
    run.add_argument("--quick", action="store_true", help="a small sweep (minutes on an H100-class GPU)")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default) or cpu (small shapes)")
    run.add_argument("--gpu", metavar="NAME", help="catalog GPU name recorded in the 'gpu' column")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", metavar="FILE.csv", default="measurements.csv", help="measurement CSV (default measurements.csv)")
    imp = sub.add_parser("import", help="convert third-party measurement tables to the measurement CSV")
    imp.add_argument("format", choices=("aiconfigurator",), help="table format")
    imp.add_argument("path", metavar="DIR", help="one system's data folder, e.g. aiconfigurator_core/systems/data/h100_sxm")
    imp.add_argument("--out", metavar="FILE.csv", required=True)
    imp.add_argument("--ops", metavar="LIST", help="comma-separated ops to keep (default: all)")
    fit = sub.add_parser("fit", help="fit a calibration profile (TOML) from measurements")
    fit.add_argument("measurements", metavar="MEASUREMENTS.csv")
    fit.add_argument("--gpu", metavar="NAME", help="catalog GPU (default: the CSV's gpu column)")
    fit.add_argument("--framework", metavar="NAME", help="fit the tables of this stack (default: the stack with most rows per op)")
    fit.add_argument("--gemm-precisions", metavar="LIST", help="comma-separated GEMM precisions to fit (default: all measured)")
    fit.add_argument("--out", metavar="P.toml", required=True)
    add_format(fit)


def add_measurement_arguments(validate: argparse.ArgumentParser) -> None:
    validate.add_argument("--measurements", metavar="FILE.csv", help="compare the cost model with these microbenchmark measurements")
    validate.add_argument("--calibration", metavar="P.toml", help=(
        "calibration profile to evaluate (with --measurements); without it, the suites' [cluster] calibration "
        "for every row: a profile TOML, or 'none' for the analytic defaults (default: each GPU's shipped profile)"))
    validate.add_argument("--holdout", type=float, metavar="F", help="hold out fraction F of the rows, fit on the rest, report on the held-out rows")
    validate.add_argument("--seed", type=int, default=0, help="seed of the holdout split (default 0)")
    validate.add_argument("--gpu", metavar="NAME", help="catalog GPU of the measurements (default: the CSV's gpu column)")
    validate.add_argument("--framework", metavar="NAME", help="evaluate the tables of this stack (default: the largest per op)")
    validate.add_argument("--max-median-error", type=float, metavar="X", help="exit 1 when a kind's median error exceeds X (fraction)")
    validate.add_argument("--out", metavar="DIR", help="write report.json and predicted-vs-measured scatter plots per op kind")


def _gpu_name(frame, given: str | None) -> str:
    from validation.calibration.report import measurement_gpu

    name = measurement_gpu(frame, given)
    try:
        get_gpu(name)
    except CatalogError as exc:
        raise MeasurementError(f"--gpu: {exc}") from None
    return name


def _out_file(path: str, example: str) -> Path:
    """``--out`` of a command that writes one file: a folder there is an error, not a traceback."""
    out = Path(path)
    if out.is_dir():
        raise MeasurementError(f"--out '{out}' is a folder; give a file name such as '{out / example}'")
    return out


def cmd_calibrate(args: argparse.Namespace, dumps) -> int:
    if args.action == "run":
        from validation.microbench import harness

        if args.gpu:
            get_gpu(args.gpu)
        out = _out_file(args.out, "measurements.csv")  # before the sweep, not after it
        try:
            rows = harness.run(device=args.device, quick=args.quick, seed=args.seed, gpu=args.gpu)
        except RuntimeError as exc:
            raise MeasurementError(str(exc)) from None
        count = write_csv(rows, out)
        print(f"wrote {count} measurements to {args.out}")
        return 0
    if args.action == "import":
        from validation.calibration.aiconfigurator import import_system, write_measurements

        _out_file(args.out, "measurements.csv")
        frame = import_system(args.path)
        if args.ops:
            ops = [o.strip() for o in args.ops.split(",") if o.strip()]
            unknown = sorted(set(ops) - set(frame["op"].unique()))
            if unknown:
                raise MeasurementError(f"--ops {args.ops}: {unknown[0]!r} not in the tables; present: {', '.join(sorted(frame['op'].unique()))}")
            frame = frame[frame["op"].isin(ops)]
        write_measurements(frame, args.out)
        counts = frame["op"].value_counts().sort_index()
        print(f"wrote {len(frame)} measurements to {args.out}: " + ", ".join(f"{op} {n}" for op, n in counts.items()))
        return 0
    from validation.calibration.fit import coverage, fit_profile

    _out_file(args.out, "profile.toml")
    frame = read_csv(args.measurements)
    name = _gpu_name(frame, args.gpu)
    precisions = [p.strip() for p in args.gemm_precisions.split(",") if p.strip()] if args.gemm_precisions else None
    profile = fit_profile(frame, get_gpu(name), framework=args.framework, gemm_precisions=precisions,
                          source=f"llmsim calibrate fit {Path(args.measurements).name} ({len(frame)} rows)")
    if not (profile.gemm or profile.attention_prefill or profile.attention_decode or profile.collectives or profile.memory or profile.launch_overhead_s):
        raise MeasurementError(f"{args.measurements}: no rows llmsim can fit (gemm, attention, collectives, memory, launch)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_toml(profile, header=f"llmsim calibration profile for {name}"))
    cover = coverage(profile)
    if args.format == "json":
        print(dumps({"gpu": name, "out": str(out), "coverage": cover}))
    else:
        print(f"wrote {out} ({name}); coverage:")
        for key, box in cover.items():
            print(f"  {key}: {box}")
    return 0


def cmd_validate_measurements(args: argparse.Namespace, dumps) -> int:
    from validation.calibration.report import measurement_report

    if args.calibration and args.holdout is not None:
        raise MeasurementError("--calibration and --holdout exclude each other (--holdout fits its own profile)")
    frame = read_csv(args.measurements)
    profile = load_profile(args.calibration) if args.calibration else None
    report = measurement_report(frame, gpu=args.gpu, calibration=profile, holdout=args.holdout, seed=args.seed,
                                framework=args.framework, max_median_error=args.max_median_error)
    if args.format == "json":
        print(dumps(report.to_json()))
    else:
        print(report.table())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report.to_json(), indent=1, allow_nan=False, default=str) + "\n")
        report.write_plots(out)
    return 0 if report.passed else 1
