"""A message on NCCL timed by NCCL's own clock: its kernel time, from NCCL's profiler.

Where NCCL loaded autotune's profiler plugin (docs/NCCL_PROFILER.md), every all-reduce NCCL ran is
a record: communicator, bytes, and the kernel's time from its first channel's start to its last
channel's stop on the GPU's timer. The engine launches its NCCL messages (`native`, every
``nccl.*`` cell) in order; `KernelClock.expect` takes a ticket for each at launch, and records
are matched to tickets in launch order by size: the first unmatched record of an all-reduce of
the ticket's bytes on the job's communicator. The communicator is the one the first match came
from (NCCL's commHash), and with it the ranks (the job's world size) must agree, so a same-sized
all-reduce of another group never takes a ticket; one of the user's on the job's own group,
launched between two of the engine's, is skipped over by size and, if it is the same size, is
the one case that can take a ticket early (its time is then a same-sized all-reduce's).
`KernelClock.seconds` waits for a ticket's record (draining the feed itself while it waits) and
gives None if none came in time: the engine then times that message as before.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.comm.nccl_feed import NcclFeed

if TYPE_CHECKING:
    from autotune_nccl import Record

__all__ = ["KernelClock", "Ticket"]


@dataclass(eq=False)
class Ticket:
    nbytes: int
    seconds: float | None = None
    comm_id: int | None = None


class KernelClock:
    """Matches NCCL's records to the engine's NCCL messages, in order."""

    def __init__(self, feed: NcclFeed, world_size: int, wait_s: float = 10.0) -> None:
        self.feed = feed
        self.world_size = world_size
        self.wait_s = wait_s
        self.comm_id: int | None = None
        self._open: deque[Ticket] = deque()
        self._ready = threading.Condition()
        self.matched = 0
        self.missed = 0  # tickets no record answered in time
        feed.subscribe(self._on_records)

    def close(self) -> None:
        self.feed.unsubscribe(self._on_records)

    def expect(self, nbytes: int) -> Ticket:
        """A ticket for the all-reduce of ``nbytes`` the engine is about to launch on NCCL."""
        ticket = Ticket(nbytes)
        with self._ready:
            self._open.append(ticket)
        return ticket

    def seconds(self, ticket: Ticket, timeout_s: float | None = None) -> float | None:
        """The ticket's kernel time, once NCCL's record of it is in; None at the timeout (and the
        ticket is withdrawn, so later records still match later tickets)."""
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        delay = 0.0002
        while True:
            with self._ready:
                if ticket.seconds is not None:
                    return ticket.seconds
            if time.monotonic() >= deadline:
                break
            if self.feed.poll() == 0:
                with self._ready:
                    self._ready.wait(delay)
                delay = min(delay * 2, 0.005)
        with self._ready:
            if ticket.seconds is not None:
                return ticket.seconds
            if ticket in self._open:
                self._open.remove(ticket)
            self.missed += 1
            return None

    def _on_records(self, records: Sequence[Record]) -> None:
        with self._ready:
            for r in records:
                if r.func != "AllReduce" or r.kernel_ns <= 0:
                    continue
                if self.comm_id is not None and r.comm_id != self.comm_id:
                    continue
                if r.nranks and r.nranks != self.world_size:
                    continue
                for ticket in self._open:
                    if ticket.nbytes == r.nbytes:
                        self._open.remove(ticket)
                        ticket.seconds = r.kernel_ns / 1e9
                        ticket.comm_id = r.comm_id
                        if self.comm_id is None and r.comm_id:
                            self.comm_id = r.comm_id
                        self.matched += 1
                        break
            self._ready.notify_all()
