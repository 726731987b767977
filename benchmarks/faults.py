"""What each failure gives the user, how soon, with which error: the fault table of docs/FAULTS.md.

    python benchmarks/faults.py
    python benchmarks/faults.py --nccl      # on a GPU machine: the contract on NCCL, 2 ranks

Runs each fault for real on local gloo ranks (the jobs of tests/jobs/ddp_jobs.py) and prints one
markdown row per fault: the ranks' errors and the seconds from the step (or register) that
failed to the error. Timings depend on the machine; the errors do not.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "jobs"))
from ddp_jobs import faulty_training, setup_with_env
from fault_jobs import (
    RING_WORKLOAD,
    plan_that_steps_aside,
    storage_with_a_ring_plan,
    train_until_it_fails,
)
from join_jobs import UNEVEN, uneven
from several_models_jobs import several_models

import autotune
from autotune.comm.launch import launch


def storage_down(rank: int, world_size: int, url: str) -> tuple[str, str, float]:
    """Register with a storage no server answers: rank 0 opens it, the others wait for rank 0."""
    from ddp_jobs import Net
    from torch.nn.parallel import DistributedDataParallel as DDP

    start = time.monotonic()
    try:
        autotune.register(DDP(Net()), autotune.Config(storage=url, timeout_s=60)).close()
    except (RuntimeError, ValueError) as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "none", "", time.monotonic() - start


def first_line(text: str, limit: int = 110) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def row(
    fault: str, results: list[Any], culprit: int, pick: Callable[[Any], tuple[str, str, float]]
) -> None:
    others = [pick(r.value) for r in results if r.rank != culprit and r.ok]
    mine = results[culprit]
    own = pick(mine.value)[:2] if mine.ok else ("(process gone)", first_line(mine.error or ""))
    slowest = max((s for _, _, s in others), default=float("nan"))
    kinds = sorted({k for k, _, _ in others})
    example = first_line(others[0][1]) if others else ""
    # A survivor ended by a signal after its error: NCCL's watchdog (SIGABRT) where on NCCL.
    signals = sorted({-r.exitcode for r in results if r.rank != culprit and (r.exitcode or 0) < 0})
    if signals:
        example += " (then ended by " + ", ".join(signal.Signals(n).name for n in signals) + ")"
    print(
        f"| {fault} | {own[0]}: {first_line(own[1], 60)} | {', '.join(kinds)}: {example} | "
        f"{slowest:.2f} |"
    )


def clean_row(case: str, results: list[Any], pick: Callable[[Any], tuple[float, float]]) -> None:
    """A case that once failed and must now train as plain DDP: what every rank gets (its
    largest relative distance from plain DDP's parameters) and the seconds it took (slowest)."""
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"| {case} | rank {failed[0].rank}: {first_line(failed[0].error or '', 60)} | | |")
        return
    rel, seconds = max(pick(r.value)[0] for r in results), max(pick(r.value)[1] for r in results)
    print(f"| {case} | (none) | no error: trains as plain DDP (within {rel:.1e}) | {seconds:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--nccl",
        action="store_true",
        help="only the contract's rows, at 2 ranks on CUDA and NCCL (a GPU machine; 2 ranks on "
        "one GPU need NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1): NCCL's watchdog against "
        "autotune's",
    )
    args = parser.parse_args()
    print("| fault | the failing rank gets | every other rank gets | seconds (slowest) |")
    print("|---|---|---|---|")
    if args.nccl:
        nccl_rows()
        return
    fault = lambda f: (f.kind, f.message, f.seconds)  # noqa: E731
    for algorithm in ("ring", "tree", "native"):
        results = launch(faulty_training, 4, algorithm, "exit", 2, 60.0, timeout_s=120, grace_s=60)
        row(f"rank 2 of 4 exits mid-step ({algorithm}, timeout_s=60)", results, 2, fault)
    results = launch(faulty_training, 3, "ring", "raise", 1, 60.0, timeout_s=120, grace_s=60)
    row("rank 1's algorithm raises (timeout_s=60)", results, 1, fault)
    results = launch(faulty_training, 3, "ring", "stall", 2, 4.0, timeout_s=120, grace_s=30)
    row("rank 2 hangs (timeout_s=4)", results, 2, fault)
    env = {"AUTOTUNE_ALGORITHM": "ring"}
    results = launch(setup_with_env, 3, {"AUTOTUNE_FUSION_BYTES": "3"}, env=env, timeout_s=120)
    row("rank 1 has AUTOTUNE_FUSION_BYTES=3 (default timeout_s=600)", results, 1, lambda v: v)
    results = launch(setup_with_env, 2, {"AUTOTUNE_SEGMENT_BYTES": "64K"}, env=env, timeout_s=120)
    row("rank 1 has another AUTOTUNE_SEGMENT_BYTES", results, 1, lambda v: v)
    results = launch(
        setup_with_env, 3, {"AUTOTUNE_FUSION_BYTES": "3"}, "default_state", env=env,
        timeout_s=120,
    )  # fmt: skip
    row("rank 1 has AUTOTUNE_FUSION_BYTES=3, default_state()", results, 1, lambda v: v)
    url = "postgresql+psycopg2://autotune@127.0.0.1:9/none"  # the discard port: refused
    results = launch(storage_down, 3, url, timeout_s=120)
    row("the storage's server is down (rank 0 opens it)", results, 0, lambda v: v)
    contract_rows()
    once_failed_rows()


def once_failed_rows() -> None:
    """Cases that once failed a healthy job (tests/ddp/test_join.py, test_several_models.py):
    uneven inputs under DDP's Join where autotune's forward pre-hook works, and two or three
    hooked models in one backward."""
    counts = ", ".join(map(str, UNEVEN))
    with tempfile.TemporaryDirectory() as tmp:
        join_in: dict[str, dict[str, Any]] = {
            "the check against plain DDP": {
                "storage": storage_with_a_ring_plan(Path(tmp) / "ring.db", 3),
                "workload": RING_WORKLOAD,
            },
            "DDP's bucket-size search": {
                "storage": f"sqlite:///{Path(tmp) / 'plans.db'}",
                "algorithms": ("native",),
                "tune_warmup": 0,
                "tune_samples": 1,
            },
        }
        for (what, config), phase in zip(join_in.items(), ("catch", "buckets"), strict=True):
            results = launch(uneven, 3, phase, {**config, "timeout_s": 20.0}, timeout_s=300)
            clean_row(
                f"Join, {counts} batches on 3 ranks, in {what}",
                results,
                lambda j: (j.rel, j.seconds),
            )
    for count in (2, 3):
        results = launch(several_models, 3, ["ring"], count, True, 10, timeout_s=300)
        clean_row(
            f"{count} models on ring in one backward, 3 ranks, 10 steps",
            results,
            lambda v: v["ring"][::2],
        )


#: The job group's timeout on NCCL, and the watchdog's dump wait (it ends a process 4 times
#: this after a failure; 15 s by default): each row then ends within about 30 s.
NCCL_GROUP_TIMEOUT_S = 10.0
NCCL_ENV = {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "2500"}


def nccl_rows() -> None:
    """The contract on NCCL at 2 ranks: hooked (native) and unhooked, a rank killed and a
    rank stopped. Where autotune unhooked on NCCL, DDP runs on the job's group (autotune
    makes no NCCL group of its own), whose timeout bounds the wait (`NCCL_GROUP_TIMEOUT_S`,
    as docs/FAULTS.md advises). After its error, NCCL's watchdog ends each survivor (the
    rank's exit code says so), as it ends any rank after a failed NCCL operation."""
    seen = lambda s: (s.kind, s.message, s.seconds)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        unhooking = {"plan_file": plan_that_steps_aside(Path(tmp) / "plan.json"), "timeout_s": 4.0}
        native = {"algorithm": "native", "timeout_s": 4.0}
        for name, config in (("native (hooked)", native), ("unhooked", unhooking)):
            for fault, wake in (("exit", False), ("stop", True)):
                results = launch(
                    train_until_it_fails, 2, {1: fault}, config, "8", wake, False, "cuda",
                    backend="nccl", timeout_s=180, pg_timeout_s=NCCL_GROUP_TIMEOUT_S,
                    env=NCCL_ENV,
                )  # fmt: skip
                row(f"NCCL, {name}: rank 1 of 2 {fault}s (timeout_s=4)", results, 1, seen)


def contract_rows() -> None:
    """Where DDP runs without the hook (unhooked, the check's plain blocks), a hang on
    native, and rank 0 serving the store (tests/ddp/test_faults_unhooked.py runs the same)."""
    seen = lambda s: (s.kind, s.message, s.seconds)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        unhooking = {"plan_file": plan_that_steps_aside(Path(tmp) / "plan.json"), "timeout_s": 4.0}
        for fault, culprit, wake in (("exit", 1, False), ("stop", 1, True), ("sleep", 2, False)):
            what = {"exit": "exits", "stop": "is stopped (SIGSTOP)", "sleep": "hangs in Python"}
            results = launch(
                train_until_it_fails, 3, {culprit: fault}, unhooking, "8", wake, timeout_s=120
            )
            row(
                f"unhooked: rank {culprit} of 3 {what[fault]} (timeout_s=4)",
                results,
                culprit,
                seen,
            )
        native = {"algorithm": "native", "timeout_s": 4.0}
        results = launch(train_until_it_fails, 3, {1: "stop"}, native, "8", True, timeout_s=120)
        row("native (hooked): rank 1 of 3 is stopped (timeout_s=4)", results, 1, seen)
        results = launch(
            train_until_it_fails, 3, {0: "stop"}, native, "8", True, timeout_s=120,
            store_on_rank0=True,
        )  # fmt: skip
        row("native: rank 0, which serves the store, is stopped (timeout_s=4)", results, 0, seen)
        url = storage_with_a_ring_plan(Path(tmp) / "t.db", 2)
        catch = {"algorithms": ("ring",), "storage": url, "max_pairs": 6, "timeout_s": 4.0}
        results = launch(train_until_it_fails, 2, {1: "stop"}, catch, "catch", True, timeout_s=120)
        row("the check's plain-DDP block: rank 1 of 2 is stopped (timeout_s=4)", results, 1, seen)


if __name__ == "__main__":
    main()
