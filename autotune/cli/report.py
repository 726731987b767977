"""``autotune report``: plots of sweeps, and of a Prometheus's dashboards."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

__all__ = ["report"]


def report(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401  (drawn with it; only checked here)
    except ImportError:
        print(
            "autotune report draws with matplotlib, which is not installed here: "
            "pip install 'autotune[report]'",
            file=sys.stderr,
        )
        return 2
    if args.prometheus:
        return _report_prometheus(args)
    from autotune.report import plan_markdown, plot_sweeps
    from autotune.sweep import SweepResult

    if not args.results:
        print(
            "autotune report: give sweep results (autotune sweep --json), or --prometheus URL",
            file=sys.stderr,
        )
        return 2
    try:
        results = [SweepResult.load(path) for path in args.results]
    except ValueError as exc:
        print(f"autotune report: {exc}", file=sys.stderr)
        return 2
    output = args.output or "busbw.png"
    fits = None
    if args.model:
        from autotune.model import MODELLED, fit
        from autotune.sweep import samples_from_sweep

        try:
            fits = [fit(samples_from_sweep(r)) for r in results]
        except ValueError as exc:
            print(f"autotune report: --model: {exc}", file=sys.stderr)
            return 2
        for path, f in zip(args.results, fits, strict=True):
            errors = ", ".join(
                f"{a} {f.median_error(a):.0%}/{f.worst_error(a):.0%}"
                for a in MODELLED
                if any(s.algorithm == a for s in f.samples)
            )
            print(f"model fitted to {path}: median/worst error {errors}")
    plot_sweeps(results, output, fits)
    print(f"wrote {output}")
    for result in results:
        table = plan_markdown(result)
        if table:
            print(f"\n{table}")
    return 0


def _report_prometheus(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.dashboards import load
    from autotune.report import PrometheusClient, render_dashboard

    if args.results:
        print("autotune report: sweep results or --prometheus, not both", file=sys.stderr)
        return 2
    out = Path(args.output or ".")
    if out.suffix:
        print(
            f"autotune report: with --prometheus, -o is a directory (one picture per "
            f"dashboard), got {out}",
            file=sys.stderr,
        )
        return 2
    try:
        dashboards = load(Path(args.dashboards))
    except ValueError as exc:
        print(f"autotune report: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    client = PrometheusClient(args.prometheus)
    try:
        for uid, dashboard in dashboards.items():
            path = out / f"{uid}.png"
            counts = render_dashboard(client, dashboard, str(path), minutes=args.minutes)
            empty = [title for title, n in counts.items() if n == 0]
            note = f"; no data: {', '.join(empty)}" if empty else ""
            print(f"wrote {path} ({len(counts) - len(empty)}/{len(counts)} panels with data{note})")
    except (RuntimeError, ValueError) as exc:
        print(f"autotune report: {exc}", file=sys.stderr)
        return 1
    return 0
