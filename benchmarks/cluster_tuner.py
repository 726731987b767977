"""The live tuner across an emulated cluster: the example job under torchrun, fixed modes and
tuning runs taking turns in one cluster.

    sudo python benchmarks/cluster_tuner.py --layout 2x2 --rate-mbit 1000 --steps 600 \\
        --fixed plain,native,hierarchical_ring,ring --runs 3

In one `autotune.testing.cluster.Cluster`, ``examples/train_ddp.py --steps N`` runs once per
fixed mode (``plain`` is DDP without the hook, the others ``--algorithm NAME``), then ``--runs``
times with the tuner on from a fresh SQLite storage each. Printed per run: steps/s, and for the
tuning runs the step from which everything stayed locked, the verdict line, what screening
measured and nominated, and every duel (rank 0's log). Needs root.
"""

from __future__ import annotations

import argparse
import logging
import re
import runpy
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autotune.testing.cluster import Cluster

_EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
_STEPS_S = re.compile(r": ([0-9.]+) steps/s over")
_LOCKED = re.compile(r"tuner: everything locked from step (\d+)")


@dataclass
class Run:
    mode: str
    steps_per_s: float
    locked_at: int | None = None
    verdict: str = ""
    log: list[str] = field(default_factory=list)


def parse(mode: str, output: str) -> Run:
    """Rank 0's lines of a node-0 output."""
    speed = _STEPS_S.search(output)
    if speed is None:
        raise RuntimeError(f"{mode}: no steps/s line in the job's output:\n{output}")
    locked = _LOCKED.search(output)
    lines = output.splitlines()
    return Run(
        mode,
        float(speed.group(1)),
        int(locked.group(1)) if locked else None,
        next((ln for ln in lines if ln.startswith("autotune vs plain DDP")), ""),
        [ln for ln in lines if ln.startswith("autotune ") and "vs plain DDP" not in ln],
    )


def job() -> None:
    """Under torchrun: the example, with rank 0 logging the tuner's screening and duels."""
    import os

    if os.environ.get("RANK") == "0":
        logging.basicConfig(format="%(message)s")
        logging.getLogger("autotune").setLevel(logging.INFO)
    sys.argv = [_EXAMPLE, *sys.argv[2:]]
    runpy.run_path(_EXAMPLE, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", default="2x2", help="NODESxRANKS")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="each node link, each way")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--fixed", default="plain,native,hierarchical_ring,ring")
    p.add_argument("--runs", type=int, default=3, help="tuning runs, each from a fresh storage")
    p.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    args = p.parse_args(argv)
    nodes, _, ranks = args.layout.partition("x")
    modes = [m for m in args.fixed.split(",") if m] + ["auto"] * args.runs
    runs = []
    with (
        tempfile.TemporaryDirectory(prefix="autotune-cluster-") as tmp,
        Cluster(int(nodes), int(ranks), args.rate_mbit) as cluster,
    ):
        for k, mode in enumerate(modes):
            script = [__file__, "--job", "--steps", str(args.steps)]
            if mode == "plain":
                script.append("--no-hook")
            else:
                script += ["--algorithm", mode]
            env = {"AUTOTUNE_STORAGE": f"sqlite:///{tmp}/plans-{k}.db"}
            done = cluster.torchrun(script, timeout_s=args.timeout_s, env=env)
            run = parse(mode, done[0].output)
            runs.append(run)
            print(f"{mode}: {run.steps_per_s:.1f} steps/s", flush=True)
            if mode == "auto":
                print(f"  locked from step {run.locked_at}; {run.verdict}")
                for line in run.log:
                    print(f"  {line}")
                sys.stdout.flush()
    print("\n| mode | steps/s | locked from step | verdict |\n|---|---|---|---|")
    for run in runs:
        locked = "-" if run.locked_at is None else str(run.locked_at)
        print(f"| {run.mode} | {run.steps_per_s:.1f} | {locked} | {run.verdict or '-'} |")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job()
    else:
        sys.exit(main())
