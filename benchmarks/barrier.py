"""What one barrier among the ranks of a host costs: gloo's one-element all-reduce against pipes.

    python benchmarks/barrier.py --world-sizes 2,4 --rounds 300

`shm` waits at a barrier once (2 ranks) or twice (more) per message; it went through gloo (a
one-element all-reduce on the dedicated group, 2(N-1) loopback TCP hops in turn) and now goes
through pipes between the ranks (`autotune.algorithms._pipes.PipeBarrier`). On spawned CPU ranks,
one intra-op thread each, nothing else running, each way timed two ways: "aligned", every rank
let go together by an untimed gloo barrier first, so the wait is the barrier's own latency plus
the ranks' skew on leaving the one before; and "back to back", ``--rounds`` barriers in a row,
their mean. Per rank: the median of the aligned ones; the table shows the slowest rank's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from autotune.algorithms import Comm, p2p_group
from autotune.algorithms import _shared_memory as shm
from autotune.algorithms._pipes import PipeBarrier
from autotune.comm.launch import run_local


def timings(rank: int, world_size: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(1)
    group = p2p_group()
    comm = Comm(group, rank, world_size, "gloo", "shm", timedelta(seconds=60))
    prefix = os.path.join(shm.SHM_DIR, f"autotune-barrier-bench-{os.getppid()}")
    pipes = PipeBarrier.open(comm, prefix)
    one = torch.zeros(1, dtype=torch.int32)

    def gloo() -> None:
        dist.all_reduce(one, group=group)

    def piped() -> None:
        pipes.wait(comm, "a barrier")

    out: dict[str, float] = {}
    for name, barrier in (("gloo", gloo), ("pipes", piped)):
        aligned = []
        for _ in range(rounds):
            dist.barrier()
            begin = time.perf_counter()
            barrier()
            aligned.append(time.perf_counter() - begin)
        dist.barrier()
        begin = time.perf_counter()
        for _ in range(rounds):
            barrier()
        out[f"{name}_back_to_back_ms"] = (time.perf_counter() - begin) / rounds * 1e3
        out[f"{name}_aligned_ms"] = statistics.median(aligned) * 1e3
    pipes.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--rounds", type=int, default=300)
    args = p.parse_args()
    print("| ranks | gloo: aligned | back to back | pipes: aligned | back to back |")
    print("|---|---:|---:|---:|---:|")
    for n in (int(w) for w in args.world_sizes.split(",")):
        got = run_local(timings, n, args.rounds, threads=1)
        worst = {k: max(g[k] for g in got) for k in got[0]}
        print(
            f"| {n} | {worst['gloo_aligned_ms']:.3f} ms | {worst['gloo_back_to_back_ms']:.3f} ms "
            f"| {worst['pipes_aligned_ms']:.3f} ms | {worst['pipes_back_to_back_ms']:.3f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
