"""The ``autotune`` command line: ``algorithms``, ``trees N``, ``show``, ``daemon``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _algorithms(args: argparse.Namespace) -> int:
    from autotune.algorithms import ALGORITHMS, PLUGIN_SOURCES, available

    names = available()
    print(f"{'name':<10} {'segmented':<9} {'default segment':>15}  source")
    for name in names:
        cls = ALGORITHMS[name]
        source = PLUGIN_SOURCES.get(name, "built in")
        seg = f"{cls.default_segment_bytes >> 10} KiB" if cls.segmented else "-"
        print(f"{name:<10} {'yes' if cls.segmented else 'no':<9} {seg:>15}  {source}")
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

    from autotune.store import Store, default_storage_url
    from autotune.units import format_bytes

    url = args.storage or default_storage_url()
    tables = Store(url).tables()
    if args.key:
        if args.key not in tables:
            known = ", ".join(tables) or "none"
            print(
                f"autotune show: no plan {args.key!r} in {url} (stored: {known})", file=sys.stderr
            )
            return 2
        tables = {args.key: tables[args.key]}
    if (args.json or args.nccl_csv) and len(tables) != 1:
        print(
            f"autotune show: {len(tables)} plans in {url}; pick one with --key to export it",
            file=sys.stderr,
        )
        return 2
    if not tables:
        print(f"no tuned plans in {url}")
        return 0
    for key, table in tables.items():
        fp = table.fingerprint or {}
        where = ", ".join(f"{k}={v}" for k, v in fp.items())
        fusion = "DDP's buckets" if not table.fusion_bytes else format_bytes(table.fusion_bytes)
        print(f"plan {key}: {where}; fusion: {fusion}")
        head = f"{'size class':>10}  {'algorithm':<10} {'segment':>9} {'best':>10}"
        print(f"  {head} {'trials':>6}  state")
        for cls, e in sorted(table.classes.items()):
            seg = format_bytes(e.choice.segment_bytes) if e.choice.segment_bytes else "default"
            best = f"{e.best_s * 1e3:.2f}ms" if e.best_s is not None else "-"
            print(
                f"  {format_bytes(cls):>10}  {e.choice.algorithm:<10} {seg:>9} {best:>10} "
                f"{e.trials:>6}  {e.state}"
            )
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


def _daemon(args: argparse.Namespace) -> int:
    from autotune.metrics import run_daemon

    return run_daemon(args.host, args.port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="autotune", description="Profiling and autotuning of all-reduce for PyTorch DDP."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("algorithms", help="list the registered all-reduce algorithms")
    p.set_defaults(func=_algorithms)
    p = sub.add_parser("trees", help="draw the double binary tree for N ranks")
    p.add_argument("size", type=int, metavar="N")
    p.set_defaults(func=_trees)
    p = sub.add_parser("show", help="print the tuned plans in the storage; export one")
    p.add_argument(
        "--storage", help="Optuna storage URL (default: AUTOTUNE_STORAGE, else the cache)"
    )
    p.add_argument("--key", help="the plan to show or export (the fingerprint key printed)")
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON (for Config.plan_file)")
    p.add_argument("--nccl-csv", metavar="FILE", help="write the plan as NCCL tuner plugin CSV")
    p.set_defaults(func=_show)
    p = sub.add_parser("daemon", help="serve this node's GPU (NVML) and host metrics")
    p.add_argument("--port", type=int, default=9401, help="port to serve /metrics on (9401)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.set_defaults(func=_daemon)
    args = parser.parse_args(argv)
    if getattr(args, "storage", "unset") is None:
        args.storage = os.environ.get("AUTOTUNE_STORAGE")
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
