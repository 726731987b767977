"""How well the cost model fits this machine's sweeps: error per algorithm and world size.

    python benchmarks/model_fit.py docs/sweeps/sweep-2.json docs/sweeps/sweep-4.json \\
        docs/sweeps/sweep-8.json

Each sweep (one world size) is fitted on its own (`autotune.model.fit`: base, alpha, beta and
gamma shared by every algorithm), then all of them together. Printed: the fitted prices, and the
median and worst |predicted / measured - 1| per algorithm, as a markdown table.
"""

from __future__ import annotations

import argparse
import sys

from autotune.model import MODELLED, Fit, fit, samples_from_sweep
from autotune.sweep import SweepResult


def _row(label: str, f: Fit, names: list[str]) -> str:
    p = f.params
    gbps = f"{1 / p.intra.beta_s_per_byte / 1e9:.2f}" if p.intra.beta_s_per_byte else "inf"
    cells = " | ".join(
        f"{f.median_error(a):.0%} / {f.worst_error(a):.0%}"
        if any(s.algorithm == a for s in f.samples)
        else "-"
        for a in names
    )
    return (
        f"| {label} | {p.base_s * 1e6:.0f} us | {p.intra.alpha_s * 1e6:.0f} us | {gbps} GB/s | "
        f"{p.gamma_s_per_byte * 1e9:.2f} ns/B | {cells} | {f.median_error():.0%} / "
        f"{f.worst_error():.0%} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", help="autotune sweep --json files")
    args = p.parse_args(argv)
    results = [SweepResult.load(path) for path in args.sweeps]
    swept = {a for r in results for a in r.algorithms()}
    names = [a for a in MODELLED if a in swept]
    heads = " | ".join(f"{a}: median / worst" for a in names)
    print(f"| fitted to | base | alpha | 1/beta | gamma | {heads} | all |")
    print("|---" * (6 + len(names)) + "|")
    everything = []
    for r in results:
        samples = samples_from_sweep(r)
        everything += samples
        print(_row(f"{r.world_size} ranks", fit(samples), names))
    if len(results) > 1:
        print(_row("all together", fit(everything), names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
