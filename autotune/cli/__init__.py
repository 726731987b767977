"""The ``autotune`` command line: ``sweep``, ``model``, ``report``, ``show``, ``forget``,
``daemon``, ``dashboards``, ``algorithms``, ``trees N``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from autotune.cli.dashboards import dashboards
from autotune.cli.report import report
from autotune.cli.show import forget, show

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


def _sweep(args: argparse.Namespace) -> int:
    from autotune.cli.sweep import main as sweep_main

    return sweep_main(args)


def _model(args: argparse.Namespace) -> int:
    from autotune.cli.model import main as model_main

    return model_main(args)


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
    p.set_defaults(func=report)
    p = sub.add_parser("dashboards", help="build the Grafana dashboards; push them to a Grafana")
    actions = p.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help="generate dashboards/*.json from code")
    b.add_argument("--dir", default="dashboards", help="where the JSON goes (dashboards)")
    b.add_argument("--check", action="store_true", help="only say whether the files are current")
    b.set_defaults(func=dashboards)
    b = actions.add_parser(
        "push", help="create or update the dashboards in a Grafana (token: GRAFANA_TOKEN)"
    )
    b.add_argument("--url", required=True, help="Grafana's URL, e.g. http://localhost:3000")
    b.add_argument("--dir", default="dashboards", help="the dashboards' JSON (dashboards)")
    b.add_argument("--folder", default="autotune", help="Grafana folder, made if missing")
    b.set_defaults(func=dashboards)
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
    p.set_defaults(func=show)
    p = sub.add_parser(
        "forget", help="forget a stored plan: its next job tunes from scratch (studies stay)"
    )
    p.add_argument(
        "plan", help="KEY/WORKLOAD as 'autotune show' prints it, a fingerprint KEY, or a WORKLOAD"
    )
    p.add_argument(
        "--storage", help="Optuna storage URL (default: AUTOTUNE_STORAGE, else the cache)"
    )
    p.set_defaults(func=forget)
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
