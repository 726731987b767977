"""``autotune model``: predicted all-reduce time and busbw per algorithm, nccl-tests style."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from collections.abc import Callable

from autotune.algorithms import available
from autotune.ddp.stats import bus_factor
from autotune.model._cost import DEFAULT_SEGMENT_BYTES, Link, Shape, predict
from autotune.model._fit import Fit, fit
from autotune.model._nccl import NCCL_SOURCE, PROTOCOLS, nccl_native, nccl_params
from autotune.model._schedule import MODELLED
from autotune.sweep import samples_from_sweep
from autotune.util.names import unknown as unknown_names
from autotune.util.units import byte_count

__all__ = ["add_arguments", "main"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need whole numbers >= 1, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=_ints, default=[8, 64, 1024, 24576], help="e.g. 8,64,1024")
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks on each node (8)")
    p.add_argument("-b", "--minbytes", type=byte_count, default=8, help="smallest size (8)")
    p.add_argument("-e", "--maxbytes", type=byte_count, default=256 << 20, help="largest (256M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="multiply size by this (4)")
    p.add_argument("--algorithms", default=",".join(MODELLED), help=f"any of {','.join(MODELLED)}")
    p.add_argument(
        "--segment-bytes",
        type=byte_count,
        default=DEFAULT_SEGMENT_BYTES,
        help=f"pipeline segment of ring and trees ({DEFAULT_SEGMENT_BYTES >> 20}M, as they run)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--nccl",
        choices=PROTOCOLS,
        default="LL",
        help="price with NCCL's latencies for this protocol (the default: LL)",
    )
    src.add_argument("--fit", metavar="SWEEP_JSON", help="price with a fit to this sweep")
    p.add_argument("--intra", choices=("nvlink", "pci"), default="nvlink", help="NCCL preset")
    p.add_argument("--intra-gbps", type=float, default=50.0, help="NCCL preset: GB/s (50)")
    p.add_argument("--inter-gbps", type=float, default=12.5, help="NCCL preset: GB/s (12.5)")
    p.add_argument(
        "--wide",
        action="store_true",
        help="one table per world size however wide; by default the algorithms are split over "
        "tables that fit the terminal (100 columns where there is none)",
    )


def _sizes(args: argparse.Namespace) -> list[int]:
    out, size = [], args.minbytes
    while size <= args.maxbytes:
        out.append(size)
        size *= args.stepfactor
    return out


def main(args: argparse.Namespace) -> int:
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in names if a not in MODELLED]
    problems = []
    if unknown:
        what = unknown_names("algorithm", unknown, MODELLED)
        problems.append(f"{what}: no model for it (modelled: {', '.join(MODELLED)})")
    if args.ranks_per_node < 1:
        problems.append(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.stepfactor < 2 or args.minbytes < 1 or args.maxbytes < args.minbytes:
        problems.append("sizes: need -b >= 1, -e >= -b and -f >= 2")
    if args.segment_bytes < 1:
        problems.append(f"--segment-bytes must be >= 1, got {args.segment_bytes}")
    if problems:
        for problem in problems:
            print(f"autotune model: {problem}", file=sys.stderr)
        return 2
    width = None if args.wide else shutil.get_terminal_size((100, 24)).columns
    if args.fit:
        from autotune.sweep import SweepResult

        try:
            fitted = fit(samples_from_sweep(SweepResult.load(args.fit)))
        except (OSError, ValueError) as exc:
            print(f"autotune model: {exc}", file=sys.stderr)
            return 1
        _say(f"prices: fitted to {args.fit}; {_describe(fitted)}", width)

        def time_of(name: str, size: int, shape: Shape) -> float:
            return predict(name, size, shape, fitted.params, args.segment_bytes)

    else:
        _say(
            f"prices: NCCL {args.nccl} latencies ({NCCL_SOURCE}); links assumed "
            f"{args.intra} {args.intra_gbps:g} GB/s inside a node, {args.inter_gbps:g} GB/s "
            "between nodes",
            width,
        )

        links = {"intra": args.intra, "intra_gbps": args.intra_gbps, "inter_gbps": args.inter_gbps}

        def time_of(name: str, size: int, shape: Shape) -> float:
            if name == "native":  # NCCL's own pick of its ring and tree
                return nccl_native(size, shape, args.nccl, args.segment_bytes, **links)[0]
            params = nccl_params(name, args.nccl, multi_node=shape.nodes > 1, **links)
            return predict(name, size, shape, params, args.segment_bytes)

    for ranks in args.ranks:
        _table(ranks, args.ranks_per_node, _sizes(args), names, time_of, args.segment_bytes, width)
    return 0


def _link(link: Link) -> str:
    gbps = 1 / link.beta_s_per_byte / 1e9 if link.beta_s_per_byte else float("inf")
    return f"alpha {link.alpha_s * 1e6:.1f} us a message, {gbps:.2f} GB/s"


def _describe(f: Fit) -> str:
    p = f.params
    links = f"{_link(p.intra)}"
    if any(s.shape.nodes > 1 for s in f.samples):
        links = f"inside a node {_link(p.intra)}; between nodes {_link(p.inter)}"
    else:
        links += " (one node: the fit says nothing of links between nodes)"
    return (
        f"base {p.base_s * 1e6:.1f} us, {links}, gamma {p.gamma_s_per_byte * 1e9:.3f} ns/B; "
        f"error on the sweep: median {f.median_error():.0%}, worst {f.worst_error():.0%}"
    )


def _say(text: str, width: int | None) -> None:
    """A ``#`` comment line, wrapped to ``width`` (None: one line)."""
    if width is None:
        print(f"# {text}")
    else:
        print(textwrap.fill(text, width, initial_indent="# ", subsequent_indent="#   "))


#: A row's parts: the size, each algorithm's time and busbw, the fastest.
_SIZE_W, _CELL_W, _FASTEST_W = 15, 27, 24


def _table(
    ranks: int,
    per_node: int,
    sizes: list[int],
    names: list[str],
    time_of: Callable[[str, int, Shape], float],
    segment_bytes: int,
    width: int | None = None,
) -> None:
    """Print the table for ``ranks``; with ``width``, as many tables as it takes for the
    algorithms' columns to fit it (each names the fastest of all)."""
    if ranks == 1:
        print("\n# 1 rank: nothing to all-reduce (every algorithm returns at once)")
        return
    shape = Shape(ranks, per_node)
    times = {(name, size): time_of(name, size, shape) for size in sizes for name in names}
    # Modelled but not registered here (direct and star come with autotune-baselines): shown,
    # starred, never named fastest, since autotune cannot run them until they are installed.
    missing = set(names) - set(available())
    runnable = [n for n in names if n not in missing] or names
    fastest = {size: min(runnable, key=lambda n: times[(n, size)]) for size in sizes}
    per_table = len(names)
    if width is not None:
        per_table = max(1, (width - _SIZE_W - _FASTEST_W) // _CELL_W)
    chunks = [names[i : i + per_table] for i in range(0, len(names), per_table)]
    for k, chunk in enumerate(chunks):
        part = f" (table {k + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        print(
            f"\n# {ranks} ranks, {shape.nodes} node(s) of {min(per_node, ranks)}, "
            f"{segment_bytes} B segments{part}"
        )
        head = "".join(
            f" {n + ('*' if n in missing else '') + ' time(us)':>18} {'busbw':>7}" for n in chunk
        )
        print(f"# {'size(B)':>12}{head}  fastest")
        for size in sizes:
            cells = []
            for name in chunk:
                t = times[(name, size)]
                bw = size / t * bus_factor(ranks) / 1e9 if t > 0 else 0.0
                cells.append(f" {t * 1e6:18.1f} {bw:7.2f}")
            print(f"  {size:>12}{''.join(cells)}  {fastest[size]}")
    if missing:
        print(
            f"# * {', '.join(sorted(missing))}: modelled, not registered here (the naive "
            "baselines come with autotune-baselines: pip install ./plugins/autotune-baselines); "
            "never named fastest"
        )
