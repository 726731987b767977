"""Every NCCL process on this node, as its profiler left it: the shared files the library keeps.

Where NCCL loaded the profiler (and ``AUTOTUNE_NCCL_SHM`` is not 0), each process has a file
``autotune-nccl.<pid>`` in ``AUTOTUNE_NCCL_SHM_DIR`` (default /dev/shm) with cumulative sums per
(collective, size class, algorithm, protocol, ranks), updated by NCCL's threads with atomic adds
(docs/NCCL_PROFILER.md). `read_node` reads them all, for ``autotune daemon``: any job's
collectives, with or without autotune's hook, with nothing but ``NCCL_PROFILER_PLUGIN`` set. A
file whose process is gone is removed (the library removes its own at exit; a killed process
cannot).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BOUNDS_NS", "DEFAULT_DIR", "NodeCell", "ProcessView", "read_node"]

DEFAULT_DIR = "/dev/shm"
PREFIX = "autotune-nccl."
_MAGIC, _LAYOUT, _CELLS, _BOUNDS = 0x434E5441, 1, 256, 28
#: The kernel-time histogram's upper bounds, ns: {1, 1.8, 3.2, 5.6} x 10^3 .. 10^9.
BOUNDS_NS: tuple[int, ...] = tuple(m * 10**e for e in range(2, 9) for m in (10, 18, 32, 56))


class _Cell(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_uint64),
        ("ready", ctypes.c_uint32),
        ("nranks", ctypes.c_int32),
        ("size_class", ctypes.c_uint64),
        ("func", ctypes.c_char * 16),
        ("algo", ctypes.c_char * 16),
        ("proto", ctypes.c_char * 8),
        ("count", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("kernel_ns", ctypes.c_uint64),
        ("buckets", ctypes.c_uint64 * (_BOUNDS + 1)),
    ]


class _File(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("layout", ctypes.c_uint32),
        ("pid", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("version", ctypes.c_int32),
        ("served", ctypes.c_int32),
        ("spare", ctypes.c_int32),
        ("job", ctypes.c_char * 64),
        ("started_unix_ns", ctypes.c_uint64),
        ("records", ctypes.c_uint64),
        ("untimed", ctypes.c_uint64),
        ("ring_full", ctypes.c_uint64),
        ("pool_full", ctypes.c_uint64),
        ("cells_full", ctypes.c_uint64),
        ("cells", _Cell * _CELLS),
    ]


@dataclass(frozen=True)
class NodeCell:
    """One (collective, size class, algorithm, protocol, ranks) of one process: its sums."""

    func: str
    size_class: int
    algorithm: str  # NCCL's spelling ("RING")
    protocol: str  # "SIMPLE"
    nranks: int
    count: int
    nbytes: int
    kernel_ns: int
    buckets: tuple[int, ...]  # per bound of BOUNDS_NS, then +Inf; not cumulative


@dataclass(frozen=True)
class ProcessView:
    pid: int
    rank: int  # RANK of its environment (-1: not set)
    local_rank: int
    job: str  # AUTOTUNE_JOB, SLURM_JOB_ID or TORCHELASTIC_RUN_ID ("" if none)
    version: int  # the profiler symbol NCCL loaded
    served: int  # the port of the rank exporter that serves it (0: none; the daemon does)
    records: int
    untimed: int
    ring_full: int
    pool_full: int
    cells_full: int  # records of a cell the file had no room for (256 cells)
    cells: tuple[NodeCell, ...]


def read_node(directory: str | os.PathLike[str] | None = None) -> list[ProcessView]:
    """Every live process's view in ``directory`` (default AUTOTUNE_NCCL_SHM_DIR or /dev/shm)."""
    where = Path(directory or os.environ.get("AUTOTUNE_NCCL_SHM_DIR") or DEFAULT_DIR)
    out = []
    try:
        paths = sorted(where.glob(PREFIX + "*"))
    except OSError:
        return []
    for path in paths:
        view = _read(path)
        if view is not None:
            out.append(view)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's, alive
    return True


def _read(path: Path) -> ProcessView | None:
    try:
        pid = int(path.name.removeprefix(PREFIX))
    except ValueError:
        return None
    if not _alive(pid):
        path.unlink(missing_ok=True)  # killed before its exit handler ran
        return None
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < ctypes.sizeof(_File):
        return None
    f = _File.from_buffer_copy(raw)
    if f.magic != _MAGIC or f.layout != _LAYOUT or f.pid != pid:
        return None  # still being set up, or another layout
    cells = tuple(
        NodeCell(
            func=c.func.decode(errors="replace"),
            size_class=c.size_class,
            algorithm=c.algo.decode(errors="replace"),
            protocol=c.proto.decode(errors="replace"),
            nranks=c.nranks,
            count=c.count,
            nbytes=c.bytes,
            kernel_ns=c.kernel_ns,
            buckets=tuple(c.buckets),
        )
        for c in f.cells
        if c.key and c.ready and c.count
    )
    return ProcessView(
        pid=pid,
        rank=f.rank,
        local_rank=f.local_rank,
        job=f.job.decode(errors="replace"),
        version=f.version,
        served=f.served,
        records=f.records,
        untimed=f.untimed,
        ring_full=f.ring_full,
        pool_full=f.pool_full,
        cells_full=f.cells_full,
        cells=cells,
    )
