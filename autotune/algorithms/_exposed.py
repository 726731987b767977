"""A rank's input shared with its peers on the host where it is, so they read it there.

`shm` copies each rank's input into the rank's slot of a shared window, for its peers to read.
Where the input is memory that lives on (DDP's gradient buckets: the same tensors every
iteration), that copy can go once and for all: the storage under it is moved into shared memory
in place, by torch's own `share_memory_` mechanism, which swaps the memory under every tensor and
view of that storage (DDP's views of the bucket follow it), and the peers map it through
``/proc/<pid>/fd``, the way a process opens another's file descriptor. At the window's first
barrier a rank then sends a `Record` of where its input is instead of copying it; a peer maps
that storage the first time it sees it and sums its share straight from it.

Each rank decides for itself, each message: where its input cannot be shared so (memory another
mechanism shares already, ``/dev/shm`` short of room, an old torch), it copies into its slot as
before and its record says so. Whether peers can open each other's descriptors at all (one PID
namespace, ``/proc`` readable) is checked once per window (`check`), on every rank together.

The storage moved stays in ``/dev/shm`` (an unlinked file: nothing is left there when the
process ends) for as long as its owner keeps it; a peer's mapping keeps a storage its owner has
freed (DDP rebuilds its buckets once, after the first iteration) until the peer has not read it
for `IDLE_MESSAGES` messages.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

__all__ = [
    "MAX_PARTS",
    "Deferred",
    "Exposed",
    "Operands",
    "copied",
    "exact",
    "record_bytes",
    "share_operands",
    "sum_share",
]

#: A record: in place or copied, the owner's pid, how many parts; then per part where it is
#: (the storage's descriptor at its owner, the file's inode, the storage's bytes, the part's
#: offset in it, in bytes). Every rank's record of a message is as long: its parts are as many.
_HEAD = struct.Struct("<B3xiI")
_PART = struct.Struct("<i4xQQQ")
_COPIED, _IN_PLACE = 0, 1
#: The most parts a message is sent in place in: its record fits a pipe's atomic write.
MAX_PARTS = (select.PIPE_BUF - _HEAD.size) // _PART.size
#: A peer's storage not read for this many messages is unmapped: its owner has most likely freed
#: it (DDP reads every bucket every iteration), and the mapping would keep it in ``/dev/shm``.
IDLE_MESSAGES = 1024
#: Memory is moved into ``/dev/shm`` only where twice its size is free there.
ROOM_FACTOR = 2

#: Where a share's part is summed (elements from, to, of the message) and its operands, one
#: per rank in rank order, each with its scale (None: as it is).
Operands = list[tuple[int, int, list[tuple[torch.Tensor, float | None]]]]


def record_bytes(parts: int) -> int:
    """The length of a message's record, for a message of ``parts`` parts."""
    return _HEAD.size + parts * _PART.size


def copied(parts: int) -> bytes:
    """The record of a rank that copied its message of ``parts`` parts into its slot."""
    return _HEAD.pack(_COPIED, 0, parts).ljust(record_bytes(parts), b"\0")


@dataclass
class _Mine:
    """A storage of this rank's that it moved into shared memory."""

    nbytes: int
    fd: int  # torch's (its MapAllocator keeps it open while the storage lives)
    ino: int


@dataclass
class _Mapped:
    """A peer's storage, mapped here."""

    base: torch.Tensor  # uint8, the whole storage
    used: int  # the message that last read it


class Exposed:
    """This rank's storages moved into shared memory, and its peers' mapped here."""

    def __init__(self) -> None:
        self._mine: dict[int, _Mine] = {}  # by the storage's data pointer
        self._theirs: dict[tuple[int, int], _Mapped] = {}  # by (peer, inode)
        #: Each message's operands, by what every rank's record said and what is summed: a
        #: model sends the same buckets every iteration, so their views are made once.
        self._shares: dict[tuple[object, ...], _Share] = {}
        self._messages = 0

    def record(self, parts: list[torch.Tensor], room: Callable[[], int]) -> bytes:
        """The record of where this rank's message, the concatenation of ``parts`` (each flat,
        contiguous, on CPU), is for its peers: in place, after moving each part's storage into
        shared memory where it was not yet (``room()``: bytes free in ``/dev/shm``); or
        `copied` where one cannot be shared so, and the caller copies them into its slot."""
        entries = []
        for part in parts:
            storage = part.untyped_storage()
            mine = self._mine.get(storage.data_ptr())
            if mine is not None and not _still(storage, mine):
                del self._mine[storage.data_ptr()]  # freed; other memory at the address now
                mine = None
            if mine is None:
                mine = self._move(storage, room)
                if mine is None:
                    return copied(len(parts))
            offset = part.data_ptr() - storage.data_ptr()
            entries.append(_PART.pack(mine.fd, mine.ino, mine.nbytes, offset))
        return _HEAD.pack(_IN_PLACE, os.getpid(), len(parts)) + b"".join(entries)

    def _move(self, storage: torch.UntypedStorage, room: Callable[[], int]) -> _Mine | None:
        share = getattr(storage, "_share_fd_cpu_", None)
        if storage.is_shared() or share is None or ROOM_FACTOR * storage.nbytes() > room():
            return None  # shared by something else (torch.multiprocessing ...), or no room
        try:
            fd, nbytes = share()  # moves it, copying it once, under every view of it
        except RuntimeError:
            return None  # /dev/shm filled up meanwhile: torch reserves it first (no SIGBUS)
        mine = _Mine(int(nbytes), int(fd), os.fstat(fd).st_ino)
        self._mine[storage.data_ptr()] = mine
        return mine

    def sources(
        self, peer: int, record: bytes, read: list[_Mapped] | None = None
    ) -> list[torch.Tensor] | None:
        """Peer ``peer``'s parts as its ``record`` says where: each its storage (uint8, flat)
        from the part's first byte on, mapped here the first time (and added to ``read``);
        None where the peer copied them into its slot. Raises `RuntimeError` where the record
        names a file this rank cannot open."""
        kind, pid, count = _HEAD.unpack_from(record)
        if kind == _COPIED:
            return None
        out = []
        for i in range(count):
            fd, ino, nbytes, offset = _PART.unpack_from(record, _HEAD.size + i * _PART.size)
            mapped = self._theirs.get((peer, ino))
            if mapped is None:
                mapped = _Mapped(_map(pid, fd, ino, nbytes), self._messages)
                self._theirs[(peer, ino)] = mapped
            mapped.used = self._messages
            out.append(mapped.base[offset:])
            if read is not None:
                read.append(mapped)
        return out

    def operands(
        self,
        mine: bytes,
        theirs: dict[int, bytes],
        parts: list[torch.Tensor],
        scale: float | None,
        share: tuple[int, int],
        slots: torch.Tensor,
    ) -> Operands:
        """`share_operands` for a message of ``parts``, this rank's, whose record was ``mine``
        and its peers' ``theirs`` (by rank) at its first barrier: made once for the same
        records and share, then kept while in use (a model sends the same buckets each
        iteration)."""
        rank = next(r for r in range(len(theirs) + 1) if r not in theirs)
        records = [theirs.get(r, mine) for r in range(len(theirs) + 1)]
        key = (*records, scale, share, slots.dtype, slots.data_ptr(), *(p.numel() for p in parts))
        found = self._shares.get(key)
        if found is None:
            own = None if mine == copied(len(parts)) else [p.view(torch.uint8) for p in parts]
            read: list[_Mapped] = []
            sources = [
                own if r == rank else self.sources(r, record, read)
                for r, record in enumerate(records)
            ]
            sizes = [p.numel() for p in parts]
            found = _Share(share_operands(sizes, scale, share, slots, sources), read)
            self._shares[key] = found
        found.used = self._messages
        for m in found.mapped:
            m.used = self._messages
        return found.operands

    def done(self) -> None:
        """A message is done: unmap the peers' storages not read for `IDLE_MESSAGES`, and
        forget the operands not summed for as long (they hold the storages)."""
        self._messages += 1
        now = self._messages
        for key in [k for k, share in self._shares.items() if now - share.used > IDLE_MESSAGES]:
            del self._shares[key]
        idle = [k for k, m in self._theirs.items() if now - m.used > IDLE_MESSAGES]
        for key in idle:
            del self._theirs[key]

    def mapped(self) -> int:
        """How many of the peers' storages are mapped here."""
        return len(self._theirs)

    def moved(self) -> int:
        """How many of this rank's storages it moved into shared memory (and still knows of)."""
        return len(self._mine)


@dataclass
class _Share:
    """A message's operands as this rank sums its share, and the peers' storages among them."""

    operands: Operands
    mapped: list[_Mapped]
    used: int = 0  # the message that last summed them


@dataclass
class Deferred:
    """``parts`` a caller gathers, times ``scale``, into the slot at ``slot`` (a data pointer),
    left to the `start` on that slot that follows (`SharedMemoryAllReduce.gather`)."""

    slot: int
    parts: list[torch.Tensor]
    scale: float


def share_operands(
    sizes: list[int],
    scale: float | None,
    share: tuple[int, int],
    slots: torch.Tensor,
    sources: list[list[torch.Tensor] | None],
) -> Operands:
    """What this rank sums for its ``share`` (elements lo to hi) of a message of parts of
    ``sizes`` elements, in ``slots``' dtype: from each rank's ``sources`` (by rank), its parts
    as bytes from each part's first on (times ``scale``), or, where None, its row of ``slots``
    (scaled already). Part by part, so that a part's operands are views."""
    lo, hi = share
    dtype, size = slots.dtype, slots.element_size()
    out: Operands = []
    begin = 0
    for i, numel in enumerate(sizes):
        end = begin + numel
        a, b = max(begin, lo), min(end, hi)
        if b > a:
            operands: list[tuple[torch.Tensor, float | None]] = []
            for rank, source in enumerate(sources):
                if source is None:
                    operands.append((slots[rank, a:b], None))
                else:
                    there = source[i][(a - begin) * size : (b - begin) * size]
                    operands.append((there.view(dtype), scale))
            out.append((a, b, operands))
        begin = end
    return out


def sum_share(out: torch.Tensor, operands: Operands) -> None:
    """Sum a share's ``operands`` (`share_operands`) into ``out``, the whole message's result."""
    for a, b, each in operands:
        sum_scaled(out[a:b], each)


def sum_scaled(out: torch.Tensor, operands: list[tuple[torch.Tensor, float | None]]) -> None:
    """``out`` = the sum of ``operands``, each times its scale (None: as it is), in order. With
    a scale `exact` allows, bitwise what scaling each first would give."""
    (a, scale_a), (b, scale_b) = operands[0], operands[1]
    if scale_a is None:
        torch.add(a, b, alpha=1 if scale_b is None else scale_b, out=out)
    elif scale_b is None:
        torch.add(b, a, alpha=scale_a, out=out)  # a + b and b + a are bitwise the same
    else:
        torch.mul(a, scale_a, out=out)
        out.add_(b, alpha=scale_b)
    for operand, scale in operands[2:]:
        out.add_(operand, alpha=1 if scale is None else scale)


def exact(scale: float | None, dtype: torch.dtype) -> bool:
    """Whether a sum may scale its operands as it adds them, bitwise as scaling them first: by
    a power of two, exact in float32, float64 and bfloat16 (but for a product below the normal
    range, some 1e-38 in float32); not in float16, where gradients are often that small."""
    if scale is None:
        return True
    return dtype in (torch.float32, torch.float64, torch.bfloat16) and math.frexp(scale)[0] == 0.5


def _still(storage: torch.UntypedStorage, mine: _Mine) -> bool:
    """Whether ``storage`` is still the one this rank moved (the address may be reused)."""
    if not storage.is_shared() or storage.nbytes() != mine.nbytes:
        return False
    try:
        return os.fstat(mine.fd).st_ino == mine.ino
    except OSError:
        return False


def _map(pid: int, fd: int, ino: int, nbytes: int) -> torch.Tensor:
    """Process ``pid``'s file ``fd`` (inode ``ino``, ``nbytes`` long), mapped here, shared."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        own = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise RuntimeError(f"could not open a peer's shared memory at {path}: {exc}") from exc
    try:
        if os.fstat(own).st_ino != ino:
            raise RuntimeError(
                f"{path} is not the peer's shared memory (another process has its pid here)"
            )
        storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{own}", shared=True, nbytes=nbytes)
    finally:
        os.close(own)
    return torch.empty(0, dtype=torch.uint8).set_(cast(torch.UntypedStorage, storage))


def check(mine: bytes, theirs: dict[int, bytes], expected: dict[int, int]) -> bool:
    """Whether every peer's probe (``theirs``: its record of a small storage that holds its
    rank, ``expected``) maps here and holds what it should; ``mine``: this rank's own record,
    `copied` where its probe could not be shared."""
    if mine == copied(1):
        return False
    probe = Exposed()
    with contextlib.suppress(RuntimeError, OSError):
        got = {p: probe.sources(p, r) for p, r in theirs.items()}
        return all(
            s is not None and int(s[0][:8].view(torch.int64)[0]) == expected[p]
            for p, s in got.items()
        )
    return False
