"""The ``autotune`` command line: ``sweep``, ``model``, ``report``, ``show``, ``forget``,
``daemon``, ``dashboards``, ``algorithms``, ``trees N``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.plan import Table

__all__ = ["main"]


def here() -> tuple[str, ...]:
    """This machine's backend/device pairs: gloo on CPU, and with a GPU gloo and NCCL on CUDA."""
    import torch
    import torch.distributed as dist

    found = []
    if dist.is_available() and dist.is_gloo_available():
        found.append("gloo/cpu")
        if torch.cuda.is_available():
            found.append("gloo/cuda")
    if dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available():
        found.append("nccl/cuda")
    return tuple(found)


def _algorithms(args: argparse.Namespace) -> int:
    from autotune.algorithms import ALGORITHMS, PLUGIN_SOURCES, available

    names = available()
    machine = here()
    # A family of a plugin's (nccl.<algorithm>.<protocol>) none of which runs on this machine is
    # one row, unless --all: 24 rows of what cannot run here hid the rest.
    families: dict[str, list[str]] = {}
    for name in names:
        family, dot, _ = name.partition(".")
        cls = ALGORITHMS[name]
        if dot and not args.all and not any(r in machine for r in cls.runs_on):
            families.setdefault(family, []).append(name)
    folded = {n for members in families.values() if len(members) > 1 for n in members}
    rows: list[tuple[str, str]] = []  # (what the row says, the algorithm its columns describe)
    for name in names:
        family = name.partition(".")[0]
        if name not in folded:
            rows.append((name, name))
        elif families[family][0] == name:
            rows.append((f"{family}.* ({len(families[family])})", name))
    w = max(len("name"), *(len(label) for label, _ in rows))
    print(f"{'name':<{w}} {'segmented':<9} {'default segment':>15}  {'here':<22}  source")
    for label, name in rows:
        cls = ALGORITHMS[name]
        source = PLUGIN_SOURCES.get(name, "built in")
        seg = f"{cls.default_segment_bytes >> 10} KiB" if cls.segmented else "-"
        usable = [r for r in cls.runs_on if r in machine]
        where = ", ".join(usable) if usable else f"no: needs {' or '.join(cls.runs_on)}"
        print(
            f"{label:<{w}} {'yes' if cls.segmented else 'no':<9} {seg:>15}  {where:<22}  {source}"
        )
    if folded:
        print(
            f"\n{len(folded)} algorithms that cannot run here are folded into a row: --all "
            "lists them"
        )
    print(
        f"\nhere: this machine can run it on ({', '.join(machine) or 'no backend'}); whether a "
        "job offers it is decided on its own group (shm: one host; nccl.*: NCCL asks "
        "autotune's tuner plugin)"
    )
    return 0


def _trees(args: argparse.Namespace) -> int:
    from autotune.algorithms import double_binary_tree, render

    if args.size < 1:
        print(f"autotune trees: N must be >= 1, got {args.size}", file=sys.stderr)
        return 2
    how = "mirror" if args.size % 2 == 0 else "shift by one"
    for i, tree in enumerate(double_binary_tree(args.size)):
        label = "first tree" if i == 0 else f"second tree ({how})"
        print(f"{label}, root {tree.root}:\n{render(tree)}\n")
    return 0


def _show(args: argparse.Namespace) -> int:
    import json

    from autotune.storage import EARLIER, SWEEP, Store, storage_url
    from autotune.util.redact import redact_url
    from autotune.util.units import format_bytes

    seeds = {
        SWEEP: "a sweep's screening: seeds every job's search",
        EARLIER: "stored before plans were kept per job: seeds every job's search",
    }

    try:
        url = storage_url(args.storage, create=False)  # read only: never make a database
        stored = Store(url).tables()
    except (
        ValueError
    ) as exc:  # the storage's own error, its password masked (autotune.storage.store)
        print(f"autotune show: {exc}", file=sys.stderr)
        return 1
    url = redact_url(url)
    tables = {f"{key}/{workload}": table for (key, workload), table in stored.items()}
    if not (args.json or args.nccl_csv):
        print(f"storage: {url}")
    if args.key:
        picked = _pick(tables, args.key)
        if not picked:
            known = ", ".join(tables) or "none"
            print(
                f"autotune show: no plan {args.key!r} in {url} (stored: {known})", file=sys.stderr
            )
            return 2
        tables = picked
    if (args.json or args.nccl_csv) and len(tables) != 1:
        print(
            f"autotune show: {len(tables)} plans in {url} ({', '.join(tables) or 'none'}); pick "
            "one with --key KEY/WORKLOAD to export it",
            file=sys.stderr,
        )
        return 2
    if not tables:
        print(f"no tuned plans in {url}")
        return 0
    for name, table in tables.items():
        fp = table.fingerprint or {}
        where = ", ".join(f"{k}={v}" for k, v in fp.items())
        workload = name.split("/", 1)[1]
        if workload in seeds:
            print(f"plan {name} ({seeds[workload]}): {where}")
        else:
            fusion = "DDP's buckets" if not table.fusion_bytes else format_bytes(table.fusion_bytes)
            model = "" if table.model is None else f" ({table.model})"
            print(f"plan {name}{model}: {where}; fusion: {fusion}")
            print(f"  step: {_step_line(table)}")
        head = f"{'size class':>10}  {'algorithm':<10} {'segment':>9} {'best':>10}"
        print(f"  {head} {'trials':>6}  state")
        for cls, e in sorted(table.classes.items()):
            seg = format_bytes(e.choice.segment_bytes) if e.choice.segment_bytes else "default"
            best = f"{e.best_s * 1e3:.2f}ms" if e.best_s is not None else "-"
            print(
                f"  {format_bytes(cls):>10}  {e.choice.algorithm:<10} {seg:>9} {best:>10} "
                f"{e.trials:>6}  {e.state}"
            )
        if table.lead is not None:
            print(
                "  ahead but not beyond noise; the next job tests it again: "
                f"{table.lead.describe()}"
            )
        if table.buckets is not None:
            print(f"  unhooked onto {table.buckets.describe()}")
    if not (args.json or args.nccl_csv):
        return 0
    table = next(iter(tables.values()))  # exactly one, checked above
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table.to_json(), f, indent=2)
        print(f"wrote {args.json} (load it with Config(plan_file=...))")
    if args.nccl_csv:
        fp = table.fingerprint or {}
        csv = table.nccl_csv(int(fp.get("nodes", -1)), int(fp.get("world_size", -1)))
        with open(args.nccl_csv, "w") as f:
            f.write(csv)
        print(f"wrote {args.nccl_csv} (for NCCL_TUNER_CONFIG_FILE)")
    return 0


def _pick(tables: dict[str, Table], key: str) -> dict[str, Table]:
    """The plans ``key`` names: KEY/WORKLOAD, a fingerprint KEY (every workload's plan under it),
    or a WORKLOAD (under any key)."""
    return {n: t for n, t in tables.items() if key in (n, *n.split("/", 1))}


def _step_line(table: Table) -> str:
    """The stored plan's training step against plain DDP's, as the job that stored it measured
    it (below 1 faster), and whether that job's decision was final."""
    from autotune.util.units import count

    gain = table.buckets.gain if table.buckets is not None and table.buckets.gain else table.gain
    decided = "final" if table.final else "provisional: the next job resumes from it"
    if gain is None:
        if table.runs_native:
            return f"1.00x plain DDP's (its own all-reduce kept), {decided}"
        return f"not compared with plain DDP, {decided}"
    return (
        f"{gain.ratio:.2f}x plain DDP's ({count(gain.pairs, 'pair')}, 95% interval "
        f"{gain.interval()}), {decided}"
    )


def _forget(args: argparse.Namespace) -> int:
    from autotune.storage import Store, storage_url
    from autotune.util.redact import redact_url

    try:
        url = storage_url(args.storage, create=False)
        store = Store(url)
        stored = store.tables()
    except ValueError as exc:
        print(f"autotune forget: {exc}", file=sys.stderr)
        return 1
    tables = {f"{key}/{workload}": table for (key, workload), table in stored.items()}
    picked = _pick(tables, args.plan)
    if not picked:
        known = ", ".join(tables) or "none"
        print(
            f"autotune forget: no plan {args.plan!r} in {redact_url(url)} (stored: {known})",
            file=sys.stderr,
        )
        return 2
    for name in picked:
        key, workload = name.split("/", 1)
        runs = store.forget(key, workload)
        whose = "1 run's plan" if runs == 1 else f"{runs} runs' plans"
        print(f"forgot plan {name} ({whose}): its next job tunes from scratch")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from autotune.cli.sweep import main as sweep_main

    return sweep_main(args)


def _model(args: argparse.Namespace) -> int:
    from autotune.cli.model import main as model_main

    return model_main(args)


def _report(args: argparse.Namespace) -> int:
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


def _dashboards(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.dashboards import differences, load, write

    directory = Path(args.dir)
    if args.action == "build":
        if args.check:
            problems = differences(directory)
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print("the dashboards differ from the code: run `autotune dashboards build`")
                return 1
            print(f"{directory}: up to date")
            return 0
        for path in write(directory):
            print(f"wrote {path}")
        return 0
    from autotune.dashboards._push import PushError, push
    from autotune.util.redact import redact_url

    token = os.environ.get("GRAFANA_TOKEN") or None
    if token is None and "@" not in args.url:
        print(
            "autotune dashboards push: set GRAFANA_TOKEN to a Grafana service account token "
            "(Editor role), or put user:password in the URL for a local Grafana",
            file=sys.stderr,
        )
        return 2
    try:
        dashboards = load(directory)
    except ValueError as exc:
        print(
            f"autotune dashboards push: {exc} (run from a clone of autotune, or pass --dir)",
            file=sys.stderr,
        )
        return 2
    try:
        pushed = push(args.url, token, dashboards, args.folder)
    except PushError as exc:
        print(f"autotune dashboards push: {exc}", file=sys.stderr)
        return 1
    changed = sum(p.status != "unchanged" for p in pushed)
    print(f"{len(pushed)} dashboards at {redact_url(args.url)}, {changed} changed")
    return 0


def _daemon(args: argparse.Namespace) -> int:
    from autotune.metrics import run_daemon

    return run_daemon(args.host, args.port, nccl_dir=args.nccl_dir)


def _version() -> str:
    """The installed distribution's version (autotune's own __version__ is the package's, which
    this layer does not import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autotune")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="autotune", description="Profiling and autotuning of all-reduce for PyTorch DDP."
    )
    parser.add_argument("--version", action="version", version=f"autotune {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # sweep's and model's options come with what they run (torch, the algorithms): built only
    # for their own command, so that --help, --version and the rest never import torch.
    args_given = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in args_given if not a.startswith("-")), None)

    p = sub.add_parser(
        "sweep",
        help="benchmark all-reduce algorithms nccl-tests style; tune and store a plan",
        description="Time every algorithm at every size on local ranks (or torchrun's), "
        "nccl-tests style: -b/-e/-f/-n/-w/-c/-d as there.",
    )
    if command == "sweep":
        from autotune.cli.sweep import add_arguments as sweep_arguments

        sweep_arguments(p)
    p.set_defaults(func=_sweep)
    p = sub.add_parser(
        "model",
        help="predict all-reduce time per algorithm at any scale (cost model)",
        description="Predicted time and busbw of each algorithm, nccl-tests style, from the "
        "cost model (autotune.model): NCCL's own latencies, or a fit to a sweep's JSON.",
    )
    if command == "model":
        from autotune.cli.model import add_arguments as model_arguments

        model_arguments(p)
    p.set_defaults(func=_model)
    p = sub.add_parser(
        "report",
        help="plot sweep results (busbw, latency, the tuned plan), or the dashboards from a "
        "Prometheus",
    )
    p.add_argument("results", nargs="*", metavar="RESULTS.json", help="from autotune sweep --json")
    p.add_argument(
        "--model",
        action="store_true",
        help="also fit the cost model to each sweep and draw its predictions (docs/MODEL.md)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="the image (busbw.png); with --prometheus a directory for one per dashboard (.)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="draw each dashboard's panels from this Prometheus instead (no Grafana needed)",
    )
    p.add_argument("--dashboards", default="dashboards", help="the dashboards' JSON (dashboards)")
    p.add_argument("--minutes", type=float, default=30.0, help="time range to draw (30)")
    p.set_defaults(func=_report)
    p = sub.add_parser("dashboards", help="build the Grafana dashboards; push them to a Grafana")
    actions = p.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="generate dashboards/*.json from code")
    b.add_argument("--dir", default="dashboards", help="where the JSON goes (dashboards)")
    b.add_argument("--check", action="store_true", help="only say whether the files are current")
    b.set_defaults(func=_dashboards)
    b = actions.add_parser(
        "push", help="create or update the dashboards in a Grafana (token: GRAFANA_TOKEN)"
    )
    b.add_argument("--url", required=True, help="Grafana's URL, e.g. http://localhost:3000")
    b.add_argument("--dir", default="dashboards", help="the dashboards' JSON (dashboards)")
    b.add_argument("--folder", default="autotune", help="Grafana folder, made if missing")
    b.set_defaults(func=_dashboards)
    p = sub.add_parser("algorithms", help="list the registered all-reduce algorithms")
    p.add_argument(
        "--all", action="store_true", help="list each one, also those folded into a family's row"
    )
    p.set_defaults(func=_algorithms)
    p = sub.add_parser("trees", help="draw the double binary tree for N ranks")
    p.add_argument("size", type=int, metavar="N")
    p.set_defaults(func=_trees)
    p = sub.add_parser("show", help="print the tuned plans in the storage; export one")
    p.add_argument(
        "--storage", help="Optuna storage URL (default: AUTOTUNE_STORAGE, else the cache)"
    )
    p.add_argument(
        "--key",
        help="the plan to show or export: KEY/WORKLOAD as printed, or a fingerprint KEY (every "
        "workload's plan under it)",
    )
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON (for Config.plan_file)")
    p.add_argument("--nccl-csv", metavar="FILE", help="write the plan as NCCL tuner plugin CSV")
    p.set_defaults(func=_show)
    p = sub.add_parser(
        "forget", help="forget a stored plan: its next job tunes from scratch (studies stay)"
    )
    p.add_argument(
        "plan", help="KEY/WORKLOAD as 'autotune show' prints it, a fingerprint KEY, or a WORKLOAD"
    )
    p.add_argument(
        "--storage", help="Optuna storage URL (default: AUTOTUNE_STORAGE, else the cache)"
    )
    p.set_defaults(func=_forget)
    p = sub.add_parser(
        "daemon",
        help="serve this node's GPU (NVML) and host metrics, and its NCCL jobs' collectives",
    )
    p.add_argument("--port", type=int, default=9409, help="port to serve /metrics on (9409)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument(
        "--nccl-dir",
        default=None,
        help="where NCCL jobs that loaded autotune's profiler keep their sums "
        "(AUTOTUNE_NCCL_SHM_DIR, else /dev/shm)",
    )
    p.set_defaults(func=_daemon)
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except BrokenPipeError:
        # The reader left early (``autotune algorithms | head``): nothing went wrong here.
        # Point stdout at /dev/null so the interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return result
