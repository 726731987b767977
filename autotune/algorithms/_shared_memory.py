"""All-reduce through shared memory, for ranks that share a host: no bytes through sockets.

Each rank copies its buffer into its slot of a window in ``/dev/shm`` that every rank of the
group maps. Of N > 2 ranks, each then sums its 1/N share of the elements from every slot into
the window's result and copies the whole result back, with two barriers to say "written" and
"summed"; of 2, both sum the whole from the two slots after the first barrier alone. Either way
in rank order, so all ranks end bitwise identical. Where the caller takes the sum in the window
(DDP's buckets, through the hook), a rank's input need not be copied at all: its memory is moved
into shared memory where it is, once, and its peers sum their shares straight from it
(`autotune.algorithms._exposed`). Barriers go through pipes between the ranks
(`autotune.algorithms._pipes`), not through gloo. The scheme of NCCL's SHM transport and of
DeepSpeed's CPU all-reduce; its figures: docs/ALGORITHMS.md, "shm".

Messages larger than the window go through it in turns. The window is sized once per group
(`MAX_WINDOW_BYTES` per rank, less where ``/dev/shm`` has less room), reserved up front, so a
full ``/dev/shm`` is an error when the window is made rather than a SIGBUS in the middle of a
sum. Its file and pipes are unlinked as soon as every rank has them open: nothing is left in
``/dev/shm``, even if a rank dies. Offered on CPU tensors over gloo where every rank of the
group is on one node (`autotune.comm.topology`) and sees the same ``/dev/shm`` (checked with a
probe file).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import _exposed
from autotune.algorithms._base import AllReduceAlgorithm, at_storage_start, gathered
from autotune.algorithms._exposed import MAX_PARTS, Deferred, Exposed, exact, sum_share
from autotune.algorithms._pipes import PipeBarrier
from autotune.algorithms._transport import split
from autotune.comm import topology
from autotune.comm.groups import Comm, backend_for, group_timeout, on_forget

__all__ = ["MAX_WINDOW_BYTES", "SHM_DIR", "SharedMemoryAllReduce"]

#: Where the windows live: a tmpfs every process on a Linux host can map.
SHM_DIR = "/dev/shm"
#: A rank's slot of the window, at most: DDP's 25 MiB buckets go through in two turns, the
#: 1-16 MiB ones in one.
MAX_WINDOW_BYTES = 16 << 20
#: The smallest slot worth making; ``/dev/shm`` with less room than this per rank (and as much
#: again to spare) offers nothing.
MIN_WINDOW_BYTES = 256 << 10
#: A file name's length on the wire, at most (a prefix, a deadline and a uuid's hex).
_NAME_BYTES = 64
#: What autotune names its files in `SHM_DIR`: ``<prefix><deadline>-<uuid hex>`` (the
#: windows' pipes add ``-pipe-<rank>-<peer>``), the deadline in Unix seconds.
_PREFIXES = ("autotune-shm-", "autotune-probe-")
#: Seconds past its group's timeout a file of ours may live: its maker unlinks it once every
#: rank has mapped it, or has given up on one that did not, so one older than that is a dead
#: job's (a rank killed while the others were still mapping), and `sweep` removes it.
_STALE_AFTER_S = 60
#: Where results start in the result area: a multiple of this many bytes (a cache line).
_ALIGN = 64
#: A window's views kept (`_Window._made`) before it makes them anew: a job needs a few.
_MAX_VIEWS = 1024


@dataclass
class _Window:
    """``regions`` regions of ``slot_bytes`` each, mapped from the file that was at ``path``
    (unlinked once every rank had mapped it), and the group's ``barrier``. Of N > 2 ranks: a
    slot per rank, then `RESULT_SLOTS` slots' worth of results, which messages take in turn
    (``cursor``: where the next one's goes, in bytes), and ``exposed``, the ranks' inputs shared
    where they are (None where the ranks cannot open each other's); of 2: two pairs of slots,
    which messages take in turns (``turns`` so far)."""

    base: torch.Tensor  # uint8, regions * slot_bytes
    regions: int
    slot_bytes: int
    path: str
    barrier: PipeBarrier
    turns: int = 0
    cursor: int = 0
    exposed: Exposed | None = None
    deferred: Deferred | None = None
    #: Views of the window, by what they are of (`_made`): every message asks for its own.
    _views: dict[object, torch.Tensor] = field(default_factory=dict)

    def _made(self, key: object, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        view = self._views.get(key)
        if view is None:
            if len(self._views) > _MAX_VIEWS:
                self._views.clear()
            view = self._views[key] = make()
        return view

    def view(self, dtype: torch.dtype) -> torch.Tensor:
        return self._made(dtype, lambda: self.base.view(dtype).view(self.regions, -1))

    def results(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        """The result area of a window of ``size`` > 2 ranks, flat, in ``dtype``."""
        return self._made((size, dtype), lambda: self.base[size * self.slot_bytes :].view(dtype))

    def results_bytes(self, size: int) -> int:
        """The result area's size, in bytes, of a window of ``size`` > 2 ranks."""
        return self.base.numel() - size * self.slot_bytes

    def result(self, size: int, at: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``numel`` elements of ``dtype`` from element ``at`` of the result area (``size`` >
        2 ranks), as a tensor whose storage starts there: what DDP reads a result as."""
        area = self.results(size, dtype)
        return self._made((at, numel, dtype), lambda: at_storage_start(area[at : at + numel]))

    def take(self, nbytes: int, area_bytes: int) -> int:
        """Where in the result area a result of ``nbytes`` goes (bytes): after the last one, or
        back at the start where it would not fit. The same on every rank: every rank takes
        the same results in the same order."""
        nbytes = -(-nbytes // _ALIGN) * _ALIGN  # the next result aligned for any dtype
        at = self.cursor if self.cursor + nbytes <= area_bytes else 0
        self.cursor = at + nbytes
        return at


#: Of N > 2 ranks, the result area is this many slots: results a caller takes there
#: (`Comm.leave_within`) stay while twice their iteration's bytes fit in it (see `_run`).
RESULT_SLOTS = 4


def _regions(size: int) -> int:
    return 4 if size == 2 else size + RESULT_SLOTS


_lock = threading.Lock()
#: Windows by group name, for the world they were made in (names recur after a new init).
_windows: dict[str, _Window] = {}
_world: list[object] = [None]


class SharedMemoryAllReduce(AllReduceAlgorithm):
    """Each rank writes its buffer to shared memory, sums its share from every rank's, reads all.

    Per turn of the window, two barriers (one of 2 ranks); ``segment_bytes`` does not apply.
    """

    runs_on = ("gloo/cpu",)  # one host's shared memory, CPU tensors on gloo
    needs = "every rank of the group on one host, and a shared-memory window there"
    name = "shm"
    segmented = False
    folds_scale = True
    leaves_result = True

    @classmethod
    def offered(cls, group: ProcessGroup, device: torch.device) -> bool:
        if device.type != "cpu" or backend_for(group, device) != "gloo":
            return False
        timeout = group_timeout(group)
        if topology.detect(group, timeout).nodes != 1:
            return False
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        return _probe(Comm(group, rank, size, "gloo", cls.name, timeout))

    def stage(
        self, group: ProcessGroup | None, nbytes: int, dtype: torch.dtype, leave_within: int
    ) -> torch.Tensor | None:
        """This rank's slot, for a message of ``nbytes`` the caller takes the sum of from the
        window (``leave_within``, as `start`'s) and that goes through in one turn, at N > 2: the
        caller writes its input there, scaled, and `start`s on it, and `_put`'s copy is skipped.
        The slot is free: every rank had summed from it before the last message's second barrier.
        Collective where it makes the window (every rank stages the same messages)."""
        comm = self.connect(group, torch.device("cpu"))
        if comm.size <= 2:
            return None
        window = _window(comm)
        elements = nbytes // dtype.itemsize
        slot = window.view(dtype)[comm.rank]
        if elements > slot.numel() or not _leaves(window, comm.size, nbytes, leave_within):
            return None
        return slot[:elements]

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        window = _window(comm)
        regions = window.view(buf.dtype)
        step = regions.shape[1]
        if comm.size > 2:
            self._sum_shares(buf, comm, window)
            return
        for start in range(0, buf.numel(), step):
            part = buf[start : start + step]
            n = part.numel()
            # Both ranks sum the whole part, the same two operands in the same order, so they
            # agree bitwise, after one barrier instead of two: the two pairs of slots take
            # turns, so a rank writes the next part while its peer may still read this one
            # (not the one before: the barrier between says it was read).
            pair = regions[2 * (window.turns % 2) :][:2]
            window.turns += 1
            _put(pair[comm.rank, :n], part, comm, window)
            torch.add(pair[0, :n], pair[1, :n], out=part)

    def _sum_shares(self, buf: torch.Tensor, comm: Comm, window: _Window) -> None:
        """Of N > 2 ranks: each sums its 1/N share of every rank's slot into the result area,
        then every rank copies the whole result into ``buf``; or, where the caller takes it
        there (``comm.leave_within``), leaves it there: a pass over the message fewer.

        Each message takes the next place in the result area (`_Window.take`). A result left
        there stays until the area comes round to it again: a caller whose messages between
        two points where every rank has taken its results (DDP's: an iteration, whose next
        first message no rank can pass the first barrier of before every rank is back in
        backward) add up to at most half the area never sees one overwritten. Where that
        does not hold, or the message is larger than the area, the result goes into ``buf``."""
        regions = window.view(buf.dtype)
        step = regions.shape[1]
        slots = regions[: comm.size]
        area = window.results(comm.size, buf.dtype)
        nbytes = buf.numel() * buf.element_size()
        leave = _leaves(window, comm.size, nbytes, comm.leave_within)
        deferred, window.deferred = window.deferred, None
        parts, scale = None, comm.scale
        if deferred is not None and deferred.slot == buf.data_ptr():
            parts, scale = deferred.parts, deferred.scale  # a gather left to this (`gather`)
        elif (
            leave
            and buf.numel() <= step
            and window.exposed is not None
            and slots[comm.rank].data_ptr() != buf.data_ptr()  # not gathered there already
            and exact(comm.scale, buf.dtype)
        ):
            parts = [buf]
        if parts is not None:
            at = window.take(nbytes, window.results_bytes(comm.size)) // buf.element_size()
            comm.traffic.result = window.result(comm.size, at, buf.numel(), buf.dtype)
            self._sum_in_place(parts, scale, comm, window, comm.traffic.result)
            return
        taken = nbytes if leave else min(nbytes, step * buf.element_size())
        at = window.take(taken, window.results_bytes(comm.size)) // buf.element_size()
        result = area[at : at + taken // buf.element_size()]
        for start in range(0, buf.numel(), step):
            part = buf[start : start + step]
            n = part.numel()
            out = result[start : start + n] if leave else result[:n]
            _put(slots[comm.rank, :n], part, comm, window)
            lo, hi = split(0, n, comm.size)[comm.rank]
            if hi > lo:  # in rank order, in the dtype itself, as the other algorithms sum
                mine = out[lo:hi]
                torch.add(slots[0, lo:hi], slots[1, lo:hi], out=mine)
                for peer in range(2, comm.size):
                    mine.add_(slots[peer, lo:hi])
            _wait(comm, window, "waiting for the other ranks' sums in shared memory")
            if not leave:
                part.copy_(out)
        if leave:
            comm.traffic.result = result

    def gather(
        self, group: ProcessGroup, parts: list[torch.Tensor], flat: torch.Tensor, scale: float
    ) -> None:
        """Leave the gather to `start` on ``flat``, where the ranks may read the ``parts`` where
        they are (`_sum_in_place`); else gather them now."""
        comm = self.connect(group, torch.device("cpu"))
        window = _window(comm)
        if window.exposed is not None and len(parts) <= MAX_PARTS and exact(scale, flat.dtype):
            window.deferred = Deferred(flat.data_ptr(), parts, scale)
        else:
            super().gather(group, parts, flat, scale)

    def _sum_in_place(
        self,
        parts: list[torch.Tensor],
        scale: float | None,
        comm: Comm,
        window: _Window,
        out: torch.Tensor,
    ) -> None:
        """`_sum_shares` for a message whose sum the caller takes in the window, in one turn:
        the concatenation of ``parts``, each times ``scale``. Each rank says at the first
        barrier where its parts are (`Exposed.record`), in place or gathered into its slot, and
        each sums its share from there, part by part. (An owner's memory is read until the
        second barrier, which every rank passes only once every share is summed.)"""
        exposed, n = window.exposed, out.numel()
        assert exposed is not None
        slots = window.view(out.dtype)[: comm.size]
        mine = exposed.record(parts, _room)
        if mine == _exposed.copied(len(parts)):
            gathered(parts, slots[comm.rank, :n], scale)
        theirs = _written(comm, window, n * out.element_size(), mine)
        share = split(0, n, comm.size)[comm.rank]
        sum_share(out, exposed.operands(mine, theirs, parts, scale, share, slots))
        _wait(comm, window, "waiting for the other ranks' sums in shared memory")
        exposed.done()


def _leaves(window: _Window, size: int, nbytes: int, leave_within: int | None) -> bool:
    """Whether a message of ``nbytes`` on a window of ``size`` > 2 ranks leaves its sum in the
    result area, for a caller that takes it there within ``leave_within`` bytes of messages."""
    area_bytes = window.results_bytes(size)
    return leave_within is not None and nbytes <= area_bytes and 2 * leave_within <= area_bytes


def _put(slot: torch.Tensor, part: torch.Tensor, comm: Comm, window: _Window) -> None:
    """Write this rank's ``part`` (times ``comm.scale``) to its ``slot``; return once every rank
    has written its own."""
    if slot.data_ptr() != part.data_ptr():  # else the caller wrote it there (`stage`)
        gathered([part], slot, comm.scale)
    _written(comm, window, part.numel() * part.element_size())


def _written(comm: Comm, window: _Window, nbytes: int, record: bytes = b"\0") -> dict[int, bytes]:
    """Count ``nbytes`` as this rank's message, then the window's barrier that says every rank
    has written its own (or, in ``record``, where it is: `_sum_in_place`); the peers' records."""
    comm.traffic.bytes_sent += nbytes
    comm.traffic.messages_sent += 1
    return _wait(comm, window, "waiting for the other ranks' writes in shared memory", record)


def _wait(comm: Comm, window: _Window, what: str, record: bytes = b"\0") -> dict[int, bytes]:
    """The window's barrier, sending ``record`` (`PipeBarrier.exchange`); the peers' records.
    The seconds it kept this rank are added to ``comm.traffic`` (and are the message's first
    wait, where it had none yet)."""
    began = time.perf_counter()
    records = window.barrier.exchange(comm, what, record)
    waited = time.perf_counter() - began
    comm.traffic.wait_s += waited
    if comm.traffic.first_wait_s is None:
        comm.traffic.first_wait_s = waited
    return records


def forget_window(group: ProcessGroup) -> None:
    """Unmap ``group``'s window (`autotune.algorithms.forget_p2p_group` calls it through
    `on_forget`, once a failure aborted the group: its sums were left halfway)."""
    with _lock:
        window = _windows.pop(group.group_name, None)
    if window is not None:
        window.barrier.close()
    sweep()  # a peer that died may have left files of a window it was making


on_forget(forget_window)


def _window(comm: Comm) -> _Window:
    """The group's window, made on its first message (collective: every rank's first `_run` on
    the group is its first message there)."""
    name = comm.group.group_name
    with _lock:
        if _world[0] is not dist.group.WORLD:
            for old in _windows.values():
                old.barrier.close()
            _windows.clear()
            _world[0] = dist.group.WORLD
        window = _windows.get(name)
    if window is not None:
        return window
    # The slot: what every rank's /dev/shm can hold for all the slots, twice over.
    regions = _regions(comm.size)
    mine = min(MAX_WINDOW_BYTES, _room() // (2 * regions)) // 64 * 64
    slot = comm.smallest(mine, "agreeing on the shared-memory window's size")
    if slot < MIN_WINDOW_BYTES:
        raise RuntimeError(
            f"shm all-reduce: {SHM_DIR} has room for {slot} bytes per rank, less than "
            f"{MIN_WINDOW_BYTES}; free some, or leave 'shm' out of Config.algorithms"
        )
    base, path = _share(comm, regions * slot)
    barrier = PipeBarrier.open(comm, f"{path}-pipe")
    exposed = _exposes(comm, barrier) if comm.size > 2 else None
    window = _Window(base, regions, slot, path, barrier, exposed=exposed)
    with _lock:
        _windows[name] = window
    return window


def _exposes(comm: Comm, barrier: PipeBarrier) -> Exposed | None:
    """Whether the ranks can read each other's inputs where they are (`Exposed`): each shares a
    small probe holding its rank and opens every peer's. Collective; the same on every rank."""
    probe = torch.tensor([comm.rank], dtype=torch.int64)
    mine = Exposed().record([probe], lambda: 1 << 62)  # 8 bytes: room or not, it asks nothing else
    theirs = barrier.exchange(comm, "checking the ranks' shared memory", mine)
    ok = _exposed.check(mine, theirs, {peer: peer for peer in theirs})
    everyone = comm.smallest(int(ok), "checking the ranks' shared memory")
    return Exposed() if everyone else None


def _name(prefix: str, comm: Comm) -> str:
    """A new file name in `SHM_DIR`, with the time after which `sweep` may remove the file."""
    timeout = comm.timeout or group_timeout(comm.group)
    limit = 1800.0 if timeout is None else timeout.total_seconds()
    deadline = int(time.time() + limit + _STALE_AFTER_S)
    return f"{prefix}{deadline}-{uuid.uuid4().hex}"


def sweep(now: float | None = None) -> list[str]:
    """Remove autotune's files in `SHM_DIR` whose deadline has passed (`_name`): windows, their
    pipes and probes a job left when a rank died before they were unlinked. The names removed.
    Rank 0 of every new window sweeps first, and a rank whose group failed sweeps too."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    removed = []
    for name in names:
        prefix = next((p for p in _PREFIXES if name.startswith(p)), None)
        if prefix is None:
            continue
        deadline = name[len(prefix) :].partition("-")[0]
        if not deadline.isdigit() or int(deadline) >= now:
            continue  # not a name of ours, or not stale yet
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
    return removed


def _share(comm: Comm, nbytes: int) -> tuple[torch.Tensor, str]:
    """A file of ``nbytes`` in `SHM_DIR` that the group's rank 0 makes and reserves, mapped by
    every rank, then unlinked; and its path. Raises on every rank where any could not map it."""
    name = _name("autotune-shm-", comm)
    error: Exception | None = None
    if comm.rank == 0:
        sweep()
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)  # ENOSPC now, not SIGBUS mid-sum
            finally:
                os.close(fd)
        except OSError as exc:
            error = exc
    name = _broadcast_name(comm, name if error is None else "")
    path = os.path.join(SHM_DIR, name)
    base = None
    if name:
        try:
            storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
            base = torch.empty(0, dtype=torch.uint8).set_(cast(torch.UntypedStorage, storage))
        except RuntimeError as exc:
            error = error or exc
    try:
        everyone = comm.smallest(int(base is not None), "mapping the shared-memory window")
    finally:
        if comm.rank == 0 and name:
            with contextlib.suppress(OSError):
                os.unlink(path)
    if base is None or not everyone:
        why = f": {error}" if error is not None else " on another rank"
        raise RuntimeError(f"shm all-reduce: could not share {nbytes} bytes in {SHM_DIR}{why}")
    return base, path


def _broadcast_name(comm: Comm, name: str) -> str:
    """Rank 0's ``name`` (empty: none) on every rank of ``comm``."""
    raw = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
    if comm.rank == 0:
        data = name.encode()
        raw[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    src = comm.global_rank(0)
    comm.run(
        lambda: dist.broadcast(raw, src=src, group=comm.group, async_op=True),
        f"a file name in {SHM_DIR}",
        0,
    )
    return bytes(raw.tolist()).rstrip(b"\0").decode()


def _probe(comm: Comm) -> bool:
    """Whether every rank of ``comm`` finds in its `SHM_DIR` the file its rank 0 wrote in its
    own, and has room there for a window (a container of its own per rank has a ``/dev/shm``
    of its own)."""
    name, mine = _name("autotune-probe-", comm), ""
    if comm.rank == 0:
        sweep()
        try:
            with open(os.path.join(SHM_DIR, name), "x") as f:
                f.write(name)
            mine = name
        except OSError:
            pass
    try:
        theirs = _broadcast_name(comm, mine)
        seen = False
        if theirs:
            with contextlib.suppress(OSError), open(os.path.join(SHM_DIR, theirs)) as f:
                seen = f.read() == theirs
        room = _room() >= 2 * _regions(comm.size) * MIN_WINDOW_BYTES
        return comm.smallest(int(seen and room), f"checking {SHM_DIR} on every rank") == 1
    finally:
        if comm.rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))


def _room() -> int:
    """Bytes free in `SHM_DIR` (0 where there is none)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize
