"""PyTorch alone, no autotune: DDP's sparse all-reduce on gloo now and then corrupts the heap.

Two ranks on 127.0.0.1, each training two copies of a model with a sparse embedding
(``nn.Embedding(sparse=True)``) as plain DDP, on the same batches: one on the default group, one
on a second gloo group with 1 KB buckets (every parameter a bucket of its own, as autotune's
rebuilt reducer runs it in tests/ddp/test_sparse.py). ``--single``: one model, on the default
group, with DDP's own bucket size. ``--hooked``: the models with PyTorch's ``allreduce_hook``
(the sparse bucket through ``dist.all_reduce``, as autotune's hook sends it). Each run is a
fresh pair of processes of ``--steps`` steps; the script prints how each run ended and how many
crashed or hung::

    python tools/gloo_sparse_crash.py --runs 20 [--single] [--hooked]

A crash is glibc's word for a corrupt heap ("malloc_consolidate(): unaligned fastbin chunk
detected", "malloc(): unaligned tcache chunk detected"), or the SIGSEGV or SIGBUS it leads to,
at whatever allocation comes next (gloo's coalesce, an embedding's forward, autograd's graph
task). What was measured is in docs/FAULTS.md, "Sparse gradients". Read the crash with
``PYTHONFAULTHANDLER=1`` and a core (``ulimit -c unlimited``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "jobs"))
from sparse_net import SparseNet  # the tests' model, in torch alone


def _rank(rank: int, port: int, steps: int, single: bool, hooked: bool) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    base = SparseNet()
    plain = DDP(copy.deepcopy(base))
    if single:
        models: tuple[DDP, ...] = (plain,)
    else:
        side = dist.new_group(backend="gloo")
        models = (DDP(copy.deepcopy(base), process_group=side, bucket_cap_mb=0.001), plain)
    if hooked:  # PyTorch's allreduce_hook: the sparse bucket through dist.all_reduce
        for model in models:
            model.register_comm_hook(None, allreduce_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        ids = torch.randint(0, 1000, (8, 5), generator=g)
        other = torch.randint(0, 50, (8, 3), generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        for model, opt in zip(models, opts, strict=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(ids, other), y).backward()
            opt.step()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="fresh pairs of ranks (20)")
    parser.add_argument("--steps", type=int, default=3000, help="steps per run (3000)")
    parser.add_argument("--timeout", type=float, default=300.0, help="a run's limit, s (300)")
    parser.add_argument(
        "--single", action="store_true", help="one model, on the default group, DDP's buckets"
    )
    parser.add_argument(
        "--hooked", action="store_true", help="DDP with PyTorch's allreduce_hook registered"
    )
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)  # one run: its ranks
    args = parser.parse_args()
    if args.port is not None:  # one run: its two ranks, on this rendezvous port
        ctx = multiprocessing.get_context("forkserver")
        ranks = [
            ctx.Process(target=_rank, args=(r, args.port, args.steps, args.single, args.hooked))
            for r in range(2)
        ]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        sys.exit(max(abs(p.exitcode or 0) for p in ranks))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    failed = 0
    for run in range(args.runs):
        command = [sys.executable, __file__, "--steps", str(args.steps)]
        command += ["--single"] * args.single + ["--hooked"] * args.hooked
        command += ["--port", str(_free_port())]
        # A session of its own: a hung run's ranks (the forkserver's children) go with it.
        child = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = child.communicate(timeout=args.timeout)
            ended = "ok" if child.returncode == 0 else _why(stderr)
        except subprocess.TimeoutExpired:
            ended = f"hung (no end within {args.timeout:.0f} s)"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
        failed += ended != "ok"
        print(f"run {run + 1}/{args.runs}: {ended}", flush=True)
    print(f"{failed} of {args.runs} runs of {args.steps} steps crashed or hung")


def _why(stderr: str) -> str:
    """The first line of a rank's stderr that says how it died."""
    for words in ("malloc", "Fatal Python error", "Error"):
        for line in stderr.splitlines():
            if words in line:
                return line.strip()
    return "failed"


if __name__ == "__main__":
    main()
