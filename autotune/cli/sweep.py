"""``autotune sweep``'s flags (nccl-tests' where they exist) and how its ranks start."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from datetime import timedelta
from typing import Any, NoReturn

from autotune.comm.topology import local_rank
from autotune.sweep._options import SweepOptions
from autotune.sweep._result import SweepResult
from autotune.util.units import byte_count

__all__ = ["add_arguments", "main"]


def _names(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--minbytes", type=byte_count, default=8, help="smallest size (8); K/M/G")
    p.add_argument("-e", "--maxbytes", type=byte_count, default=32 << 20, help="largest size (32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None, help="multiply size by this (2)")
    p.add_argument(
        "-i", "--stepbytes", type=byte_count, default=None, help="or add this to the size"
    )
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (5)")
    p.add_argument("-c", "--check", type=int, default=1, help="checked iterations (1; 0: none)")
    p.add_argument("-d", "--datatype", default="float", help="float, double, half, bfloat16")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="spawn this many local ranks (default 2); under torchrun, its ranks are used",
    )
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: by backend")
    p.add_argument("--algorithms", type=_names, default=None, help="comma-separated (all)")
    p.add_argument("--segment-bytes", type=byte_count, default=None, help="pipeline segment")
    p.add_argument("--p2p", action="store_true", help="also measure the point-to-point ceiling")
    p.add_argument(
        "--tune",
        action="store_true",
        help="first tune each size class (Optuna) and store the plan for jobs",
    )
    p.add_argument(
        "--tune-algorithms",
        type=_names,
        default=None,
        help="candidates for --tune (default: what a job's 'auto' uses)",
    )
    p.add_argument("--tune-trials", type=int, default=100, help="trials per class at most")
    p.add_argument("--storage", default=None, help="Optuna storage URL for --tune")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a peer")
    p.add_argument("--json", metavar="FILE", help="write every measurement (for autotune report)")
    p.add_argument("--csv", metavar="FILE", help="write the table as CSV")


def _options(args: argparse.Namespace) -> SweepOptions:
    if args.stepfactor is not None and args.stepbytes is not None:
        raise ValueError("give -f (a factor) or -i (a step in bytes), not both")
    return SweepOptions(
        min_bytes=args.minbytes,
        max_bytes=args.maxbytes,
        step_factor=None if args.stepbytes is not None else (args.stepfactor or 2),
        step_bytes=args.stepbytes or 1 << 20,
        iters=args.iters,
        warmup=args.warmup_iters,
        check=args.check,
        dtype=args.datatype,
        algorithms=args.algorithms,
        segment_bytes=args.segment_bytes,
        backend=args.backend,
        device=args.device,
        p2p=args.p2p,
        tune=args.tune,
        tune_algorithms=args.tune_algorithms,
        tune_trials=args.tune_trials,
        storage=args.storage,
        timeout_s=args.timeout,
    )


def _quiet_optuna() -> None:
    # The sweep prints its own account of tuning; Optuna's per-study INFO lines would interleave.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _init_backend(options: SweepOptions) -> str:
    # With NCCL, CPU bookkeeping (barriers, timings) goes over gloo on the same ranks.
    return "cpu:gloo,cuda:nccl" if options.backend == "nccl" else "gloo"


def _spawned_rank(
    rank: int,
    world_size: int,
    options: SweepOptions,
    command: str,
    json_path: str | None,
    csv_path: str | None,
) -> dict[str, Any]:
    from autotune.sweep._run import run_sweep

    _quiet_optuna()
    result = run_sweep(options, command=command, json_path=json_path, csv_path=csv_path)
    return result.to_json()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def main(args: argparse.Namespace) -> int:
    command = shlex.join(["autotune", *sys.argv[1:]])
    try:
        options = _options(args)
    except ValueError as exc:
        print(f"autotune sweep: {exc}", file=sys.stderr)
        return 2
    if _under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if args.world_size not in (None, world):
            print(
                f"autotune sweep: --world-size {args.world_size} under a launcher that started "
                f"{world} ranks; leave --world-size out",
                file=sys.stderr,
            )
            return 2
        return _torchrun(options, command, args)
    from autotune.comm.launch import RankFailure, launch

    world_size = args.world_size or 2
    if world_size < 1:
        print(f"autotune sweep: --world-size must be >= 1, got {world_size}", file=sys.stderr)
        return 2
    results = launch(
        _spawned_rank,
        world_size,
        options,
        command,
        args.json,
        args.csv,
        backend=_init_backend(options),
        timeout_s=7 * 24 * 3600,
        pg_timeout_s=options.timeout_s,
    )
    if not all(r.ok for r in results):
        print(f"autotune sweep: {RankFailure(results)}", file=sys.stderr)
        return 1
    result = SweepResult.from_json(results[0].value)
    return 1 if result.wrong else 0


def _torchrun(options: SweepOptions, command: str, args: argparse.Namespace) -> NoReturn:
    import torch
    import torch.distributed as dist

    from autotune.sweep._run import run_sweep

    _quiet_optuna()
    if options.device_type == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(_init_backend(options), timeout=timedelta(seconds=options.timeout_s))
    try:
        result = run_sweep(options, command=command, json_path=args.json, csv_path=args.csv)
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown, as autotune.comm.launch does for its ranks: after a finished sweep,
    # gloo's teardown there aborted about 1 run in 20 on a 2-core machine ("terminate called
    # without an active exception"), turning a good sweep into a failed torchrun.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if result.wrong else 0)
