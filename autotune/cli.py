"""The ``autotune`` command line: ``autotune algorithms``, ``autotune trees N``."""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
