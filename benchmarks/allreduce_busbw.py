"""Bus bandwidth of every all-reduce algorithm against the backend's own, measured in one run.

    python benchmarks/allreduce_busbw.py --world-sizes 2,4 --sizes 64K,1M,16M --markdown

Spawns local gloo ranks over 127.0.0.1 (CPU tensors) and times them with `autotune sweep`'s
loop (autotune.sweep.Bench): each iteration is timed on every rank after a barrier; the
iteration's time is the slowest rank's, and the figure is the median over iterations. Algorithms
take turns inside each iteration, so drift on a shared machine hits all of them alike.
busbw = algbw * 2(n-1)/n, as nccl-tests reports it; ratios are against `native` at the same size
in the same run, taken per iteration (native and the algorithm ran back to back) and reported as
the median and interquartile range of those paired ratios. CPU is the process's user plus system
time per call (gloo's threads included), median over iterations, slowest rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch
import torch.distributed as dist

from autotune.algorithms import available, get_algorithm
from autotune.comm.launch import run_local
from autotune.ddp.stats import quartiles
from autotune.sweep import Bench, Variant, machine
from autotune.util.units import format_bytes, parse_bytes


def parse_size(text: str) -> int:
    value = parse_bytes(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def _rank(
    rank: int,
    world_size: int,
    sizes: list[int],
    variants: list[Variant],
    iters: int,
    warmup: int,
) -> dict[str, list[list[list[float]]]]:
    """Per size, [iteration][variant] = [wall seconds, CPU seconds], the slowest rank's."""
    group = dist.group.WORLD
    assert group is not None

    def progress(n: int) -> None:
        if rank == 0:
            print(".", end="", file=sys.stderr, flush=True)

    bench = Bench(group, torch.device("cpu"), torch.float32, 600.0, progress)
    out: dict[str, list[list[list[float]]]] = {}
    for size in sizes:
        m = bench.measure(size // 4, variants, iters=iters, warmup=warmup, check=1)
        assert m.wrong is not None and not any(m.wrong), f"wrong sums at {size} B: {m.wrong}"
        out[str(size)] = [
            [[wall, cpu] for wall, cpu in zip(walls, cpus, strict=True)]
            for walls, cpus in zip(m.seconds, m.cpu_seconds, strict=True)
        ]
    if rank == 0:
        print(file=sys.stderr)
    return out


def busbw_gbps(size: int, seconds: float, world_size: int) -> float:
    return size / seconds * 2 * (world_size - 1) / world_size / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated (default 2,4)")
    parser.add_argument("--sizes", default="64K,1M,16M", help="message sizes, K/M/G suffixes")
    parser.add_argument(
        "--algorithms",
        default="all",
        help="comma-separated, or 'all' (every one but NCCL's own combinations, which need NCCL)",
    )
    parser.add_argument(
        "--segment-bytes",
        default="default",
        help="comma-separated segment sizes to try for segmented algorithms ('default' = each "
        "algorithm's own); the best is reported",
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads per rank (default: cores / ranks, as torchrun; torch's own "
        "default, one per core, is what mp.spawn users get)",
    )
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--json", help="write every measurement to this file")
    args = parser.parse_args(argv)

    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    every = [a for a in available() if not a.startswith("nccl.")]  # this runs gloo
    names = every if args.algorithms == "all" else args.algorithms.split(",")
    if "native" not in names:
        names = ["native", *names]
    segs: list[int | None] = (
        [None]
        if args.segment_bytes == "default"
        else [parse_size(s) for s in args.segment_bytes.split(",")]
    )
    segmented = {name: type(get_algorithm(name)).segmented for name in names}
    variants: list[tuple[str, int | None]] = []  # (algorithm, segment_bytes or its default)
    for name in names:
        variants += [(name, s) for s in segs] if segmented[name] else [(name, None)]

    record: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/allreduce_busbw.py", *(argv or sys.argv[1:])]),
        "machine": f"{machine()}, gloo over 127.0.0.1",
        "results": [],
        "variants": [],
    }
    rows: list[dict[str, Any]] = []
    for n in world_sizes:
        timed = [Variant(f"{name}/{seg}", name, seg) for name, seg in variants]
        per_size = run_local(
            _rank, n, sizes, timed, args.iters, args.warmup, threads=args.threads, timeout_s=3600
        )[0]
        for size in sizes:
            table = [[wall for wall, _ in row] for row in per_size[str(size)]]
            cpu = {
                v: statistics.median(row[j][1] for row in per_size[str(size)])
                for j, v in enumerate(variants)
            }
            native = [row[variants.index(("native", None))] for row in table]
            medians = {
                v: statistics.median(row[j] for row in table) for j, v in enumerate(variants)
            }
            record["variants"] += [
                {
                    "world_size": n,
                    "bytes": size,
                    "algorithm": v,
                    "segment_bytes": s,
                    "time_us": t * 1e6,
                    "cpu_us": cpu[(v, s)] * 1e6,
                    "busbw_gbps": busbw_gbps(size, t, n),
                }
                for (v, s), t in medians.items()
            ]
            for name in names:
                seg = min((s for v, s in variants if v == name), key=lambda s: medians[(name, s)])
                j = variants.index((name, seg))
                # Paired: native and this algorithm ran back to back in the same iteration.
                ratios = [nat / row[j] for nat, row in zip(native, table, strict=True)]
                q1, q2, q3 = quartiles(ratios)
                seconds = medians[(name, seg)]
                row = {
                    "world_size": n,
                    "bytes": size,
                    "algorithm": name,
                    "segment_bytes": seg,
                    "time_us": seconds * 1e6,
                    "cpu_us": cpu[(name, seg)] * 1e6,
                    "busbw_gbps": busbw_gbps(size, seconds, n),
                    "vs_native": q2,
                    "vs_native_iqr": [q1, q3],
                }
                rows.append(row)
                record["results"].append(row)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    if args.markdown:
        print(f"Machine: {record['machine']}\n")
        print(
            "| ranks | size | algorithm | segment | time (us) | CPU (us) | busbw (GB/s) "
            "| vs native (median) | vs native (IQR) |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            seg_text = "default" if r["segment_bytes"] is None else format_bytes(r["segment_bytes"])
            seg_text = seg_text if segmented[r["algorithm"]] else "-"
            q1, q3 = r["vs_native_iqr"]
            print(
                f"| {r['world_size']} | {format_bytes(r['bytes'])} | {r['algorithm']} | "
                f"{seg_text} | "
                f"{r['time_us']:.0f} | {r['cpu_us']:.0f} | {r['busbw_gbps']:.3f} | "
                f"{r['vs_native']:.2f}x | {q1:.2f}-{q3:.2f} |"
            )
    else:
        print(f"{'ranks':>5} {'size':>9} {'algorithm':>10} {'time(us)':>10} {'busbw':>8} {'x':>6}")
        for r in rows:
            print(
                f"{r['world_size']:>5} {format_bytes(r['bytes']):>9} {r['algorithm']:>10} "
                f"{r['time_us']:>10.0f} {r['busbw_gbps']:>8.3f} {r['vs_native']:>5.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
