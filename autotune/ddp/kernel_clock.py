"""A message on NCCL timed by NCCL's own clock: its kernel time, from NCCL's profiler.

Where NCCL loaded autotune's profiler plugin (docs/NCCL_PROFILER.md), every all-reduce NCCL ran is
a record: communicator, bytes, and the kernel's time from its first channel's start to its last
channel's stop on the GPU's timer. The engine launches its NCCL messages (`native`, every
``nccl.*`` cell) in order, on one of two routes: the lane (the job's own communicator) or
autotune's own group (its communicator). `KernelClock.expect` takes a ticket for each at launch,
naming the route, and records are matched to tickets in launch order by size: the first
unmatched ticket of the record's bytes on the record's route. A route's communicator is the
one its first match came from (NCCL's commHash); a record of a communicator no route has yet
goes to the first route without one. With the ranks (the job's world size) they must agree,
so a same-sized all-reduce of another group never takes a ticket; one of the user's on the
job's own group, launched between two of the engine's, is skipped over by size and, if it is the
same size, is the one case that can take a ticket early (its time is then a same-sized
all-reduce's). `KernelClock.seconds` waits for a ticket's record (draining the feed itself while
it waits) and gives None if none came in time: that message then has no kernel time (its
`MessageRecord.seconds` is the GPU's events' either way). A route no record has ever answered,
after `GIVE_UP` tickets, takes no more, and nothing waits for records that do not come.
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

__all__ = ["AUTOTUNE", "GIVE_UP", "LANE", "KernelClock", "Ticket"]


#: Tickets a route takes, none of them answered, before it takes no more.
GIVE_UP = 3

#: The routes a NCCL message takes (`Engine`): the job's communicator, or autotune's group's.
LANE, AUTOTUNE = "lane", "autotune"


@dataclass(eq=False)
class Ticket:
    nbytes: int
    route: str = LANE
    seconds: float | None = None
    comm_id: int | None = None


class KernelClock:
    """Matches NCCL's records to the engine's NCCL messages, in order."""

    def __init__(self, feed: NcclFeed, world_size: int, wait_s: float = 10.0) -> None:
        self.feed = feed
        self.world_size = world_size
        self.wait_s = wait_s
        #: Each route's communicator (NCCL's commHash), from its first match.
        self.comm_ids: dict[str, int] = {}
        self._silent: dict[str, int] = {}  # route -> tickets missed, none ever answered
        self._open: deque[Ticket] = deque()
        self._ready = threading.Condition()
        self.matched = 0
        self.missed = 0  # tickets no record answered in time
        feed.subscribe(self._on_records)

    def close(self) -> None:
        self.feed.unsubscribe(self._on_records)

    def expect(self, nbytes: int, route: str = LANE) -> Ticket | None:
        """A ticket for the all-reduce of ``nbytes`` the engine is about to launch on NCCL, on
        ``route``; None where that route has given up (`GIVE_UP`)."""
        with self._ready:
            if self._silent.get(route, 0) >= GIVE_UP:
                return None
            ticket = Ticket(nbytes, route)
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
            if ticket.route not in self.comm_ids:
                self._silent[ticket.route] = self._silent.get(ticket.route, 0) + 1
            return None

    def _on_records(self, records: Sequence[Record]) -> None:
        with self._ready:
            for r in records:
                if r.func != "AllReduce" or r.kernel_ns <= 0:
                    continue
                if r.nranks and r.nranks != self.world_size:
                    continue
                known = [route for route, c in self.comm_ids.items() if c == r.comm_id]
                for ticket in self._open:
                    ours = ticket.route in known if known else ticket.route not in self.comm_ids
                    if ours and ticket.nbytes == r.nbytes:
                        self._open.remove(ticket)
                        ticket.seconds = r.kernel_ns / 1e9
                        ticket.comm_id = r.comm_id
                        if ticket.route not in self.comm_ids and r.comm_id:
                            self.comm_ids[ticket.route] = r.comm_id
                        self.matched += 1
                        break
            self._ready.notify_all()
