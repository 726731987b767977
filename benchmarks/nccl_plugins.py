"""autotune's two NCCL plugins under a real NCCL: does NCCL load them, does each steered cell run
as steered (the profiler's record says which cell ran), and what NCCL predicted against what the
kernels took. A GPU check (benchmarks/gpu_checks.sh, phase ``plugins``); needs CUDA and NCCL.

    python benchmarks/nccl_plugins.py --world-size 1 --json OUT/plugins-1.json
    LD_PRELOAD=/tmp/libnccl.so.2 NCCL_MULTI_RANK_GPU_ENABLE=1 \\
        python benchmarks/nccl_plugins.py --world-size 2 --json OUT/plugins-2.json

Every rank sets ``NCCL_TUNER_PLUGIN`` and ``NCCL_PROFILER_PLUGIN`` to the autotune-nccl library
before NCCL starts (and ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,TUNING,PROFILE`` unless
set). Per size: NCCL's own choice ``--reps`` times, then each cell every rank's NCCL offered
(the intersection, so that all ranks run the same cell), armed through the tuner before each
all-reduce. After each group the profiler's records are drained: the check is that every record
of a steered group shows the steered cell. Rank 0 writes the JSON (each rank's results) and the
Prometheus text of autotune's collector over everything drained (``--json`` with ``.prom``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from autotune.comm.launch import launch
from autotune.comm.nccl_version import runtime_version

SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)


def group_summary(
    records: list[Any], nbytes: int, steered: tuple[str, str] | None, profiled: bool = True
) -> dict[str, Any]:
    """What the profiler recorded for one group of all-reduces of ``nbytes``: which cells ran,
    whether they are the steered one, and the kernel time (median, us)."""
    from autotune_nccl.collectives import cell_of

    mine = [r for r in records if r.func == "AllReduce" and r.nbytes == nbytes]
    ran = sorted({"/".join(cell_of(r)) for r in mine})
    times = [r.kernel_ns / 1e3 for r in mine if r.kernel_ns > 0]
    return {
        "bytes": nbytes,
        "steered": "/".join(steered) if steered else None,
        "records": len(mine),
        "ran": ran,
        # None: nothing to tell it by (``profiled`` False: NCCL_PROFILER_PLUGIN=none).
        "as_steered": None if not profiled else steered is None or ran == ["/".join(steered)],
        "kernel_us_median": statistics.median(times) if times else None,
        "clock": sorted({r.clock for r in mine}),
        "channels": sorted({r.channels for r in mine}),
    }


def drain_until_quiet(profiler: Any, quiet_s: float = 0.3, cap_s: float = 5.0) -> list[Any]:
    """The records of what has run: NCCL's proxy thread reports a kernel's channels shortly
    after the GPU finishes them, so drain until nothing new arrives for ``quiet_s``."""
    out: list[Any] = []
    end, last = time.monotonic() + cap_s, time.monotonic()
    while time.monotonic() < end:
        got = profiler.drain()
        out.extend(got)
        if got:
            last = time.monotonic()
        elif time.monotonic() - last > quiet_s:
            break
        time.sleep(0.02)
    return out


def rank_main(rank: int, world_size: int, sizes: list[int], reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from autotune_nccl import Profiler, Tuner

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    tuner, profiler = Tuner(), Profiler()
    profiled = os.environ.get("NCCL_PROFILER_PLUGIN", "none") != "none"
    groups, drained = [], []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, device=device)
        for _ in range(reps):  # NCCL's own choice
            dist.all_reduce(t)
        torch.cuda.synchronize()
        usable = sorted(tuner.last().usable)
        records = drain_until_quiet(profiler)
        drained.extend(records)
        groups.append({**group_summary(records, nbytes, None, profiled), "tuner": _report(tuner)})
        offered: list[list[str]] = [[] for _ in range(world_size)]
        dist.all_gather_object(offered, ["/".join(c) for c in usable])
        common = sorted(set.intersection(*(set(o) for o in offered))) if offered[0] else []
        for cell in common:
            algo, proto = cell.split("/")
            # Said before it runs: where NCCL fails a cell hard (a crash), the log names it.
            print(f"rank {rank}: {nbytes} B steered to {cell}", file=sys.stderr, flush=True)
            for _ in range(reps):
                tuner.arm(algo, proto)
                dist.all_reduce(t)
            torch.cuda.synchronize()
            records = drain_until_quiet(profiler)
            drained.extend(records)
            summary = group_summary(records, nbytes, (algo, proto), profiled)
            groups.append({**summary, "tuner": _report(tuner)})
    tuner.disarm()
    predictions, dropped = tuner.predictions()
    return {
        "rank": rank,
        "nccl": ".".join(map(str, runtime_version() or torch.cuda.nccl.version())),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "profiler": vars(profiler.stats()),
        "predictions": len(predictions),
        "predictions_dropped": dropped,
        "groups": groups,
        "prom": _prometheus(drained, predictions, profiler),
    }


def _report(tuner: Any) -> dict[str, Any]:
    r = tuner.last()
    return {"calls": r.calls, "applied": r.applied, "refused": r.refused, "comm_id": r.comm_id}


def _prometheus(records: list[Any], predictions: list[Any], profiler: Any) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from autotune.comm.nccl_feed import NcclFeed
    from autotune.metrics import NcclMetrics

    class Drained:
        def __init__(self) -> None:
            self.left = list(records)

        def drain(self) -> list[Any]:
            out, self.left = self.left, []
            return out

        def stats(self) -> Any:
            return profiler.stats()

        def predictions(self) -> list[Any]:
            return predictions

        def mark_served(self, port: int) -> None:

            pass

    registry = CollectorRegistry()
    registry.register(NcclMetrics(NcclFeed(Drained())))
    return generate_latest(registry).decode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument(
        "--no-profiler", action="store_true", help="load the tuner alone (to tell which crashes)"
    )
    args = p.parse_args(argv)
    from autotune_nccl import library_path

    env = {
        "NCCL_TUNER_PLUGIN": library_path(),
        "NCCL_PROFILER_PLUGIN": "none" if args.no_profiler else library_path(),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "INFO"),
        "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,TUNING,PROFILE"),
    }
    results = launch(
        rank_main, args.world_size, args.sizes, args.reps, backend="nccl", env=env,
        timeout_s=args.timeout, threads=1,
    )  # fmt: skip
    out: list[Any] = []
    for rank, r in enumerate(results):
        if not r.ok:
            print(f"rank {rank} failed:\n{r.error}", file=sys.stderr)
            out.append({"rank": rank, "error": str(r.error)})
            continue
        value = dict(r.value)
        args.json.with_suffix(f".rank{rank}.prom").write_text(value.pop("prom"))
        out.append(value)
        for g in value["groups"]:
            mark = {True: "ok ", False: "NOT", None: "?  "}[g["as_steered"]]
            print(
                f"rank {rank} {g['bytes']:>9} B {g['steered'] or 'nccl own':<22} {mark} "
                f"ran {','.join(g['ran']) or '-':<22} {g['records']:>3} records "
                f"{g['kernel_us_median'] or 0:9.1f} us  tuner {g['tuner']}"
            )
    args.json.write_text(json.dumps(out, indent=1, default=str))
    failed = [g for r in out for g in r.get("groups", ()) if g["as_steered"] is False]
    return 1 if failed or any("error" in r for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
