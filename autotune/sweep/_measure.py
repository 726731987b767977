"""Timing collectives on every rank: the interleaved loop, the exact-sum check, MAX over ranks.

Every rank runs the same loop. Before each timed call the ranks meet at a barrier; each times its
own call, and an iteration's time is the slowest rank's (the one the others wait for in training).
Variants take turns inside each iteration, so drift on a shared machine hits all of them alike.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import (
    AllReduceAlgorithm,
    Comm,
    Recv,
    Send,
    Transport,
    backend_for,
    bookkeeping_device,
    connect,
    ensure_ready,
    get_algorithm,
)

__all__ = ["P2P", "Bench", "Measured", "Variant", "exact_limit", "pattern", "round_order"]

#: The label of the point-to-point "variant": each rank sends to the next, receives from the last.
P2P = "p2p"


@dataclass(frozen=True)
class Variant:
    """One thing to time: an algorithm at a segment size, under a label for its row."""

    label: str
    algorithm: str  # a registered algorithm, or P2P
    segment_bytes: int | None = None


@dataclass
class Measured:
    """One message size: per iteration and variant, the slowest rank's seconds; wrong elements."""

    seconds: list[list[float]]  # [iteration][variant]
    cpu_seconds: list[list[float]]  # process CPU time per call, the slowest rank's
    wrong: list[int] | None  # per variant, summed over ranks; None: not checked


def pattern(count: int, rank: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s input: pseudo-random values in {-1, 0, 1} that depend on the element and
    the rank, so a dropped contribution or a shifted range changes the sum, while every partial
    sum stays a small integer that even bf16 holds exactly, in any order of summation."""
    i = torch.arange(count, dtype=torch.int64, device=device)
    h = (i * 2654435761 + (rank + 1) * 2246822519) % (1 << 32)
    return ((h >> 16) % 3 - 1).to(dtype)


def exact_limit(dtype: torch.dtype) -> int:
    """How many ranks' {-1, 0, 1} inputs ``dtype`` sums exactly: every integer up to 2 / eps."""
    return round(2 / torch.finfo(dtype).eps)


class Bench:
    """Times variants at a message size on this rank, in step with the other ranks."""

    def __init__(
        self,
        group: ProcessGroup,
        device: torch.device,
        dtype: torch.dtype,
        timeout_s: float,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.group = group
        self.device = device
        self.dtype = dtype
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.timeout_s = timeout_s
        self.progress = progress or (lambda n: None)
        self._algos: dict[str, AllReduceAlgorithm] = {}
        # Bookkeeping (barrier, the MAX of timings) on the CPU where the group can, else on device.
        self._book = bookkeeping_device(group, device)
        # The sweep's own collectives wait as the algorithms do: a dead or stalled peer is a
        # PeerError naming what was pending, after timeout_s.
        self._comm = Comm(
            group,
            self.rank,
            self.world_size,
            backend_for(group, self._book),
            "autotune sweep",
            timedelta(seconds=timeout_s),
            collective="bookkeeping",
        )
        self._token = torch.zeros(1, device=self._book)
        self._cache: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._cuda = device.type == "cuda"

    @property
    def book_device(self) -> torch.device:
        """Where bookkeeping tensors (timings, codes) travel: the CPU if the group can."""
        return self._book

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` to every rank (on `book_device`)."""
        root = dist.get_global_rank(self.group, 0)
        self._wait(dist.broadcast(tensor, root, group=self.group, async_op=True), "a broadcast")

    def _wait(self, work: dist.Work | None, what: str) -> None:
        assert work is not None
        self._comm.wait(work, what)

    def _algorithm(self, name: str) -> AllReduceAlgorithm:
        algo = self._algos.get(name)
        if algo is None:
            algo = self._algos[name] = get_algorithm(name, timeout_s=self.timeout_s)
        return algo

    def _inputs(self, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's input, the exact sum, and the previous rank's input (what p2p receives).

        Made once for the largest count seen and sliced: the pattern of a prefix is the prefix.
        """
        if self._cache is None or self._cache[0] < count:
            n = self.world_size
            make = max(count, 1)
            total = torch.zeros(make, dtype=torch.int64, device=self.device)
            for r in range(n):
                total += pattern(make, r, torch.int64, self.device)
            mine = pattern(make, self.rank, self.dtype, self.device)
            left = pattern(make, (self.rank - 1) % n, self.dtype, self.device)
            self._cache = (make, mine, total.to(self.dtype), left)
        _, mine, total, left = self._cache
        return mine[:count], total[:count], left[:count]

    def _barrier(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        self._wait(dist.all_reduce(self._token, group=self.group, async_op=True), "the barrier")

    def _runner(self, variant: Variant, count: int) -> _Runner:
        """How to restore the input, run ``variant`` on it, and count wrong elements after."""
        mine, total, left = self._inputs(count)
        if variant.algorithm == P2P:
            return self._p2p_runner(mine, left)
        buf = torch.empty_like(mine)
        algo = self._algorithm(variant.algorithm)
        seg = variant.segment_bytes

        def restore() -> None:
            buf.copy_(mine)

        def run() -> None:
            algo.all_reduce(buf, self.group, segment_bytes=seg)

        def wrong() -> int:
            return int((buf != total).sum())

        return _Runner(restore, run, wrong)

    def _p2p_runner(self, mine: torch.Tensor, left: torch.Tensor) -> _Runner:
        """Each rank sends its input to the next and receives the previous one's (2+ ranks)."""
        assert self.world_size > 1, "point-to-point needs two ranks"
        count = mine.numel()
        timeout = timedelta(seconds=self.timeout_s)
        comm = connect(self.group, self.device, P2P, timeout, collective="send/recv")
        # gloo has no CUDA send/recv: on gloo the ceiling is that of host memory.
        device = self.device if comm.backend == "nccl" else torch.device("cpu")
        buf = torch.empty(2 * count, dtype=mine.dtype, device=device)
        n, r = self.world_size, self.rank
        rounds = [([Send((r + 1) % n, 0, count)], [Recv((r - 1) % n, count, 2 * count, False)])]

        expected = left.to(device)

        def restore() -> None:
            buf[:count].copy_(mine)
            buf[count:].fill_(7)  # not a value of the pattern: a receive that never lands shows

        def run() -> None:
            ensure_ready(comm, buf.device)
            Transport(buf, comm).run(rounds)

        def wrong() -> int:
            return int((buf[count:] != expected).sum())

        return _Runner(restore, run, wrong)

    def measure(
        self, count: int, variants: Sequence[Variant], *, iters: int, warmup: int, check: int
    ) -> Measured:
        """Check each variant ``check`` times, then time ``warmup + iters`` interleaved rounds.

        Each round runs the variants in an order of its own (`round_order`), the same on every
        rank: in a fixed order, a variant always follows the same one and inherits what that one
        leaves (a drained token bucket on a rate-limited link, a busy core), which skewed rows
        that run one schedule by 7-18% at 1 MiB on the emulated cluster."""
        runners = [self._runner(v, count) for v in variants]
        wrong = [0] * len(variants)
        for _ in range(check):
            for j, runner in enumerate(runners):
                runner.restore()
                runner.run()
                if self._cuda:
                    torch.cuda.synchronize(self.device)
                wrong[j] += runner.wrong()
                self.progress(1)
        times = torch.zeros(iters, len(variants), 2, dtype=torch.float64)
        for it in range(warmup + iters):
            for j in round_order(len(runners), it):
                runner = runners[j]
                runner.restore()  # the algorithms reduce in place; each call starts afresh
                self._barrier()
                cpu = time.process_time()
                start = time.perf_counter()
                runner.run()
                if self._cuda:
                    torch.cuda.synchronize(self.device)
                if it >= warmup:
                    times[it - warmup, j, 0] = time.perf_counter() - start
                    times[it - warmup, j, 1] = time.process_time() - cpu
                self.progress(1)
        times = times.to(self._book)
        self._wait(
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group, async_op=True),
            "the MAX of the timings",
        )
        checked: list[int] | None = None
        if check:
            sums = torch.tensor(wrong, dtype=torch.int64, device=self._book)
            self._wait(dist.all_reduce(sums, group=self.group, async_op=True), "the check's sum")
            checked = [int(w) for w in sums.tolist()]
        host = times.cpu()
        return Measured(host[:, :, 0].tolist(), host[:, :, 1].tolist(), checked)


def round_order(variants: int, round_index: int) -> list[int]:
    """The order of round ``round_index``: a permutation of the variants seeded by the round, so
    every rank (and every run) draws the same; over many rounds each variant runs at every
    place, after every other."""
    order = list(range(variants))
    random.Random(round_index).shuffle(order)
    return order


@dataclass(frozen=True)
class _Runner:
    restore: Callable[[], None]
    run: Callable[[], None]
    wrong: Callable[[], int]
