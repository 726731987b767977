"""All-reduce across an emulated cluster: `autotune sweep` under torchrun, one agent per node.

    sudo python benchmarks/cluster_sweep.py --layouts 2x2,4x1 --rate-mbit 1000 \\
        -b 64K -e 64M -f 4 --out docs/sweeps --markdown

Each layout (NODESxRANKS) is a fresh `autotune.testing.cluster.Cluster`: a network namespace per
node, links limited to ``--rate-mbit`` each way. The sweep measures every algorithm, the
point-to-point ceiling (every rank sends to the next: across nodes, one flow per slow link) and
the plan it tunes (``--tune``, a fresh SQLite storage). Printed per layout: busbw per algorithm
in MB/s, the ceiling, hierarchical_ring over ring against the ratio of bytes each puts on a
node's link (2(N-1)/N over 2(n-1)/n, N ranks, n nodes), and the tuned plan over the best fixed
choice. The sweeps' JSON go to ``--out`` (``autotune report`` draws them). Needs root.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotune.sweep import SweepResult
from autotune.testing.cluster import Cluster
from autotune.util.units import format_bytes


def _layout(text: str) -> tuple[int, int]:
    nodes, _, ranks = text.partition("x")
    return int(nodes), int(ranks)


def bytes_ratio(nodes: int, ranks: int) -> float:
    """Flat ring over hierarchical ring: what each puts on a node's link (ranks of a node
    consecutive, as torchrun numbers them)."""
    n_all = nodes * ranks
    if nodes == 1:
        return 1.0
    return (2 * (n_all - 1) / n_all) / (2 * (nodes - 1) / nodes)


def table(result: SweepResult, nodes: int, ranks: int) -> list[str]:
    names = [a for a in result.algorithms() if a != "tuned"]
    ceiling = {r.bytes: r.busbw_gbps for r in result.p2p}
    busbw = {(r.algorithm, r.bytes): r.busbw_gbps * 1e3 for r in result.rows}
    tuned = {t.bytes: (t, best) for t, best in result.tuned_vs_best()}
    expected = bytes_ratio(nodes, ranks)
    head = ["size", "p2p ceiling", *names, "hier / ring", "tuned (chose)", "tuned / best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sorted({r.bytes for r in result.rows}):
        cells = [format_bytes(size), f"{ceiling.get(size, 0) * 1e3:.1f}"]
        cells += [f"{busbw.get((a, size), 0):.1f}" for a in names]
        ring, hier = busbw.get(("ring", size)), busbw.get(("hierarchical_ring", size))
        cells.append(f"{hier / ring:.2f} (bytes: {expected:.2f})" if ring and hier else "-")
        if size in tuned:
            t, best = tuned[size]
            cells.append(f"{t.busbw_gbps * 1e3:.1f} ({t.chosen})")
            cells.append(f"{best.time_us / t.time_us:.2f} of {best.algorithm}")
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layouts", default="2x2,4x1", help="NODESxRANKS, comma-separated")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="each node link, each way")
    p.add_argument("-b", default="64K")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", default="4")
    p.add_argument("-n", "--iters", default="5")
    p.add_argument("-w", "--warmup", default="2")
    p.add_argument("--algorithms", default=None, help="the rows, comma-separated (default: all)")
    p.add_argument("--out", default=None, help="directory for the sweeps' JSON")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per layout")
    p.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="autotune-cluster-"))
    out.mkdir(parents=True, exist_ok=True)
    for layout in args.layouts.split(","):
        nodes, ranks = _layout(layout)
        path = out / f"cluster-{nodes}x{ranks}.json"
        with tempfile.TemporaryDirectory(prefix="autotune-cluster-") as tmp:
            sweep = [
                "-m", "autotune.cli", "sweep", "-b", args.b, "-e", args.e, "-f", args.f,
                "-n", args.iters, "-w", args.warmup, "--p2p", "--tune",
                "--storage", f"sqlite:///{tmp}/plans.db", "--json", str(path),
            ]  # fmt: skip
            if args.algorithms:
                sweep += ["--algorithms", args.algorithms]
            with Cluster(nodes, ranks, args.rate_mbit) as cluster:
                runs = cluster.torchrun(sweep, timeout_s=args.timeout_s)
        print(f"## {nodes} nodes x {ranks} ranks, {args.rate_mbit:g} Mbit/s links ({path})")
        if not args.markdown:
            print(runs[0].output)
        result = SweepResult.load(str(path))
        print("\n".join(table(result, nodes, ranks)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
