"""How well the cost model fits this machine's sweeps: error per algorithm and world size.

    python benchmarks/model_fit.py docs/sweeps/sweep-2.json docs/sweeps/sweep-4.json \\
        docs/sweeps/sweep-8.json
    python benchmarks/model_fit.py docs/sweeps/cluster-2x2.json docs/sweeps/cluster-4x1.json

Each sweep is fitted on its own (`autotune.model.fit`: base, alpha, beta and gamma shared by
every algorithm; a sweep across nodes gets an alpha and a beta between nodes too), then all of
them together. Printed: the fitted prices, and the median and worst |predicted / measured - 1|
per algorithm, as a markdown table.
"""

from __future__ import annotations

import argparse
import sys

from autotune.comm.topology import Topology
from autotune.model import MODELLED, Fit, Link, fit
from autotune.sweep import SweepResult, samples_from_sweep


def _gbps(link: Link) -> str:
    return f"{1 / link.beta_s_per_byte / 1e9:.2f}" if link.beta_s_per_byte else "inf"


def _row(label: str, f: Fit, names: list[str], nodes: bool) -> str:
    p = f.params
    cells = " | ".join(
        f"{f.median_error(a):.0%} / {f.worst_error(a):.0%}"
        if any(s.algorithm == a for s in f.samples)
        else "-"
        for a in names
    )
    links = f"{p.intra.alpha_s * 1e6:.0f} us | {_gbps(p.intra)} GB/s"
    if nodes:
        spans = any(s.shape.nodes > 1 for s in f.samples)
        inter = f"{p.inter.alpha_s * 1e6:.0f} us | {_gbps(p.inter)} GB/s" if spans else "- | -"
        links += f" | {inter}"
    return (
        f"| {label} | {p.base_s * 1e6:.0f} us | {links} | {p.gamma_s_per_byte * 1e9:.2f} ns/B | "
        f"{cells} | {f.median_error():.0%} / {f.worst_error():.0%} |"
    )


def _label(r: SweepResult) -> str:
    if r.node_of and max(r.node_of) > 0:
        return Topology(tuple(r.node_of)).describe()
    return f"{r.world_size} ranks"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", help="autotune sweep --json files")
    args = p.parse_args(argv)
    results = [SweepResult.load(path) for path in args.sweeps]
    swept = {a for r in results for a in r.algorithms()}
    names = [a for a in MODELLED if a in swept]
    heads = " | ".join(f"{a}: median / worst" for a in names)
    nodes = any(r.node_of and max(r.node_of) > 0 for r in results)
    links = "alpha | 1/beta"
    if nodes:
        links = "alpha in a node | 1/beta in a node | alpha between nodes | 1/beta between nodes"
    print(f"| fitted to | base | {links} | gamma | {heads} | all |")
    print("|---" * (4 + links.count("|") + 1 + len(names)) + "|")
    everything = []
    for r in results:
        samples = samples_from_sweep(r)
        everything += samples
        print(_row(_label(r), fit(samples), names, nodes))
    if len(results) > 1:
        print(_row("all together", fit(everything), names, nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
