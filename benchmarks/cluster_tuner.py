"""The live tuner across an emulated cluster: the example job under torchrun, fixed modes and
tuning runs taking turns in one cluster.

    sudo python benchmarks/cluster_tuner.py --layout 2x2 --rate-mbit 1000 --steps 600 \\
        --fixed plain,native,hierarchical_ring,ring --runs 3 \\
        --prior docs/sweeps/cluster-2x2.json,docs/sweeps/cluster-4x1.json

In one `autotune.testing.cluster.Cluster`, ``examples/train_ddp.py --steps N`` runs once per
fixed mode (``plain`` is DDP without the hook, the others ``--algorithm NAME``), then ``--runs``
times with the tuner on from a fresh SQLite storage each, and with ``--prior`` as many times
again from a storage holding only the cost model's fit to those sweeps (the first of the
cluster's own layout), stored as ``autotune sweep --tune`` stores it; with ``--compression``
as many times again allowed those wire dtypes (a fixed mode may name one: ``native+bf16``).
Printed per run: steps/s, and for the tuning runs the step from which everything stayed locked,
the step time spent until then, the verdict line, what screening measured and shortlisted, and
every paired test (rank 0's log). Needs root.
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

from autotune.model import Prior
from autotune.sweep import SweepResult, store_prior
from autotune.testing.cluster import Cluster

_EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
_STEPS_S = re.compile(r": ([0-9.]+) steps/s over")
_LOCKED = re.compile(r"tuner: everything locked from step (\d+)")
_EXPLORING = re.compile(r"step time until locked: ([0-9.]+) s")


@dataclass
class Run:
    mode: str
    steps_per_s: float
    locked_at: int | None = None
    exploring_s: float | None = None
    verdict: str = ""
    log: list[str] = field(default_factory=list)


def parse(mode: str, output: str) -> Run:
    """Rank 0's lines of a node-0 output."""
    speed = _STEPS_S.search(output)
    if speed is None:
        raise RuntimeError(f"{mode}: no steps/s line in the job's output:\n{output}")
    locked = _LOCKED.search(output)
    exploring = _EXPLORING.search(output)
    lines = output.splitlines()
    return Run(
        mode,
        float(speed.group(1)),
        int(locked.group(1)) if locked else None,
        float(exploring.group(1)) if exploring else None,
        next((ln for ln in lines if ln.startswith("autotune vs plain DDP")), ""),
        [ln for ln in lines if ln.startswith("autotune ") and "vs plain DDP" not in ln],
    )


def _sweeps(paths: str, nodes: int, ranks: int) -> list[SweepResult]:
    results = [SweepResult.load(p) for p in paths.split(",") if p]
    node_of = results[0].node_of if results else None
    if node_of != [k for k in range(nodes) for _ in range(ranks)]:
        raise SystemExit(
            f"--prior: the first sweep must be of the cluster's layout ({nodes}x{ranks})"
        )
    return results


def job() -> None:
    """Under torchrun: the example, with rank 0 logging the tuner's screening and paired tests."""
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
    p.add_argument("--prior", help="sweeps (comma-separated) whose fit also tunes --runs times")
    p.add_argument(
        "--compression",
        default="",
        help="wire dtypes (bf16,fp16) a further --runs tuning runs may use (Config.compression)",
    )
    p.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    args = p.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # storing the prior creates a study
    nodes, _, ranks = args.layout.partition("x")
    modes = [m for m in args.fixed.split(",") if m] + ["auto"] * args.runs
    sweeps = _sweeps(args.prior, int(nodes), int(ranks)) if args.prior else []
    modes += ["auto+prior"] * (args.runs if sweeps else 0)
    modes += [f"auto+{args.compression}"] * (args.runs if args.compression else 0)
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
                script += ["--algorithm", "auto" if mode.startswith("auto") else mode]
            storage = f"sqlite:///{tmp}/plans-{k}.db"
            if mode == "auto+prior":
                fitted = store_prior(storage, sweeps)
                bound = Prior.from_fit(fitted).worst_error
                print(f"prior: worst error {bound:.0%} on its sweeps (without native)")
            env = {"AUTOTUNE_STORAGE": storage}
            if mode == f"auto+{args.compression}":
                env["AUTOTUNE_COMPRESSION"] = args.compression
            done = cluster.torchrun(script, timeout_s=args.timeout_s, env=env)
            run = parse(mode, done[0].output)
            runs.append(run)
            print(f"{mode}: {run.steps_per_s:.1f} steps/s", flush=True)
            if mode.startswith("auto"):
                print(f"  locked from step {run.locked_at} ({run.exploring_s} s); {run.verdict}")
                for line in run.log:
                    print(f"  {line}")
                sys.stdout.flush()
    print("\n| mode | steps/s | locked from step | step time until locked | verdict |")
    print("|---|---|---|---|---|")
    for run in runs:
        locked = "-" if run.locked_at is None else str(run.locked_at)
        spent = "-" if run.exploring_s is None else f"{run.exploring_s:.1f} s"
        print(f"| {run.mode} | {run.steps_per_s:.1f} | {locked} | {spent} | {run.verdict or '-'} |")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job()
    else:
        sys.exit(main())
