"""The NCCL profiler plugin's Python side: what NCCL measured, drained from the library's ring.

NCCL loads the library through ``NCCL_PROFILER_PLUGIN=<library_path()>`` (the same file as the
tuner; `Profiler.environ` gives both variables). For every collective on every communicator it
keeps a `Record`: the communicator, sequence number, function, bytes, NCCL's algorithm, protocol
and channels, and the kernel time (first channel start to last channel stop, on the GPU's timer
from NCCL 2.27 on, the host's before); from NCCL 2.31 (v7) also the kernel variant, whether the
kernel was symmetric, the call's user tag and a symmetric kernel's phases; and what recording it
cost NCCL's threads. `Profiler.drain` moves completed records out; it is cheap
(one ctypes call per 256 records) and never blocks NCCL's threads. `Profiler.stats` counts what
could not be kept (a full ring, a full pool, events that were not ours): see
docs/NCCL_PROFILER.md.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from autotune_nccl._library import library_path

__all__ = ["CLOCKS", "PHASES", "Profiler", "ProfilerStats", "Record"]

#: How a record's kernel time was taken: none (no channel stopped), NCCL's GPU timer, the host.
CLOCKS = ("none", "gpu", "host")
#: NCCL's kernel phases (profiler v7's phaseId 0, 1, 2): the order of `Record.phase_ns`.
PHASES = ("initial_sync", "compute", "final_sync")
_BATCH = 256
_STALE_NS = 10_000_000_000  # AP_STALE_NS


class _Record(ctypes.Structure):
    _fields_ = [
        ("comm_id", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("kernel_ns", ctypes.c_uint64),
        ("longest_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("rank", ctypes.c_int32),
        ("nranks", ctypes.c_int32),
        ("nnodes", ctypes.c_int32),
        ("channels", ctypes.c_int32),
        ("channels_seen", ctypes.c_int32),
        ("clock", ctypes.c_int32),
        ("version", ctypes.c_int32),
        ("flags", ctypes.c_int32),
        ("func", ctypes.c_char * 16),
        ("algo", ctypes.c_char * 16),
        ("proto", ctypes.c_char * 8),
        ("dtype", ctypes.c_char * 16),
        ("user_tag", ctypes.c_uint64),
        ("phase_ns", ctypes.c_uint64 * 3),
        ("cost_ns", ctypes.c_uint64),
        ("symmetric", ctypes.c_int32),
        ("phases_seen", ctypes.c_int32),
        ("variant", ctypes.c_char * 32),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("comms", ctypes.c_int32),
        ("comms_total", ctypes.c_uint64),
        ("records", ctypes.c_uint64),
        ("drained", ctypes.c_uint64),
        ("ring_full", ctypes.c_uint64),
        ("pool_full", ctypes.c_uint64),
        ("stale", ctypes.c_uint64),
        ("orphans", ctypes.c_uint64),
        ("late", ctypes.c_uint64),
        ("ignored", ctypes.c_uint64),
        ("in_flight", ctypes.c_int32),
        ("mask", ctypes.c_int32),
        ("sampled_out", ctypes.c_uint64),
        ("chained", ctypes.c_uint64),
        ("chain_failures", ctypes.c_uint64),
        ("chain_version", ctypes.c_int32),
        ("sample_every", ctypes.c_int32),
    ]


@dataclass(frozen=True)
class Record:
    """One collective as NCCL ran it."""

    comm_id: int  # NCCL's commHash (0 under a v3 NCCL that gave none)
    rank: int
    nranks: int  # 0 where NCCL did not say (v3)
    nnodes: int
    seq: int  # NCCL's sequence number of this function on this communicator
    func: str  # NCCL's name: "AllReduce", "AllGather", "ReduceScatter", ...
    dtype: str  # "ncclFloat32", ...
    count: int
    nbytes: int  # count x the type's size (0 for a type this plugin does not know)
    algorithm: str  # NCCL's: "RING", "TREE", "NVLS", ...
    protocol: str  # "LL", "LL128", "SIMPLE"
    channels: int
    channels_seen: int
    kernel_ns: int  # first channel start to last channel stop
    longest_ns: int  # the longest single channel (NCCL Inspector's execution time)
    clock: str  # one of CLOCKS
    version: int  # the profiler symbol NCCL loaded (3 to 7)
    incomplete: bool  # fewer channels stopped than NCCL announced (reclaimed after 10 s)
    end_ns: int  # the host's CLOCK_MONOTONIC when it completed
    #: The plugin's own time in NCCL's calls for this collective, up to its record: what
    #: profiling it cost NCCL's threads (without a chained profiler's time). Timed on every
    #: 16th collective of a communicator; 0 on the others.
    cost_ns: int = 0
    # What NCCL 2.31 (profiler v7) adds; empty, None and 0 where NCCL did not say:
    kernel_variant: str = ""  # NCCL's kernel variant
    symmetric: bool | None = None  # whether NCCL ran a symmetric-memory kernel
    user_tag: int = 0  # the call's ncclCollConfig_t.userProfilerTag (0: untagged)
    #: Symmetric kernels' phases (initial sync, compute, final sync), each its longest channel's
    #: GPU time in ns; `phases_seen` phase events arrived (0: none, and these are 0).
    phase_ns: tuple[int, int, int] = (0, 0, 0)
    phases_seen: int = 0


@dataclass(frozen=True)
class ProfilerStats:
    """The library's counters since the process started."""

    version: int  # the profiler symbol NCCL loaded last (0: NCCL has not loaded it)
    comms: int  # communicators live
    comms_total: int
    records: int  # written into the ring
    drained: int
    ring_full: int  # complete records dropped because nobody drained the ring in time
    pool_full: int  # collectives not tracked: more in flight than the pool holds
    stale: int  # collectives recorded incomplete
    orphans: int  # events with a handle or parent that was not a live one of ours
    late: int  # events on a finalised communicator
    ignored: int  # events of types not asked for
    in_flight: int
    mask: int  # the events asked for (0: AUTOTUNE_NCCL_PROFILER=0; v7 adds kernel phases)
    sampled_out: int  # collectives left out by AUTOTUNE_NCCL_PROFILER_SAMPLE
    chained: int  # calls forwarded to the chained profiler (AUTOTUNE_NCCL_PROFILER_CHAIN)
    chain_failures: int  # its library, symbol, init or a call failing (logged once)
    chain_version: int  # the version it is called at (0: no chained profiler)
    sample_every: int  # AUTOTUNE_NCCL_PROFILER_SAMPLE (1: every collective)

    @property
    def lost(self) -> int:
        """Collectives NCCL ran that no record will show."""
        return self.ring_full + self.pool_full


class Profiler:
    """The profiler's ring and counters, for this process (one library, every communicator)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or library_path()
        lib = ctypes.CDLL(self.path)
        lib.ap_drain.argtypes = [ctypes.POINTER(_Record), ctypes.c_int]
        lib.ap_drain.restype = ctypes.c_int
        lib.ap_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.ap_ring_capacity.restype = ctypes.c_int
        lib.ap_pool_capacity.restype = ctypes.c_int
        lib.ap_reclaim.argtypes = [ctypes.c_uint64]
        lib.ap_shm_served.argtypes = [ctypes.c_int32]
        lib.ap_shm_path.restype = ctypes.c_char_p
        self._lib = lib
        self._buffer = (_Record * _BATCH)()
        self.ring_capacity = int(lib.ap_ring_capacity())
        self.pool_capacity = int(lib.ap_pool_capacity())

    def environ(self) -> dict[str, str]:
        """What makes NCCL load both plugins (set before NCCL initialises a communicator)."""
        return {"NCCL_PROFILER_PLUGIN": self.path, "NCCL_TUNER_PLUGIN": self.path}

    @property
    def loaded(self) -> bool:
        """Whether NCCL has initialised a communicator with this profiler in this process."""
        return self.stats().version > 0

    def drain(self, limit: int | None = None) -> list[Record]:
        """Move completed records out of the ring (all of them, or up to ``limit``)."""
        out: list[Record] = []
        while limit is None or len(out) < limit:
            want = _BATCH if limit is None else min(_BATCH, limit - len(out))
            n = self._lib.ap_drain(self._buffer, want)
            out.extend(_record(self._buffer[i]) for i in range(n))
            if n < want:
                break
        return out

    def stats(self) -> ProfilerStats:
        raw = _Stats()
        self._lib.ap_stats(ctypes.byref(raw))
        return ProfilerStats(**{f[0]: getattr(raw, f[0]) for f in _Stats._fields_})

    @property
    def node_file(self) -> str | None:
        """This process's file for ``autotune daemon`` (None: none, or NCCL has not started)."""
        return self._lib.ap_shm_path().decode() or None

    def mark_served(self, port: int) -> None:
        """Say in the node's file that a rank exporter on ``port`` serves this process's
        collectives, so that ``autotune daemon`` does not serve them twice."""
        self._lib.ap_shm_served(port)

    def reclaim(self, idle_s: float = 0.0) -> None:
        """Record now, flagged incomplete, the collectives NCCL stopped and whose announced
        channels have not all arrived for ``idle_s`` (the library does this itself, at 10 s,
        when its pool is full)."""
        self._lib.ap_reclaim(max(0, _STALE_NS - int(idle_s * 1e9)))


def _record(r: _Record) -> Record:
    return Record(
        comm_id=r.comm_id,
        rank=r.rank,
        nranks=r.nranks,
        nnodes=r.nnodes,
        seq=r.seq,
        func=r.func.decode(errors="replace"),
        dtype=r.dtype.decode(errors="replace"),
        count=r.count,
        nbytes=r.bytes,
        algorithm=r.algo.decode(errors="replace"),
        protocol=r.proto.decode(errors="replace"),
        channels=r.channels,
        channels_seen=r.channels_seen,
        kernel_ns=r.kernel_ns,
        longest_ns=r.longest_ns,
        clock=CLOCKS[r.clock] if 0 <= r.clock < len(CLOCKS) else "none",
        version=r.version,
        incomplete=bool(r.flags & 1),
        end_ns=r.end_ns,
        cost_ns=r.cost_ns,
        kernel_variant=r.variant.decode(errors="replace"),
        symmetric=None if r.symmetric < 0 else bool(r.symmetric),
        user_tag=r.user_tag,
        phase_ns=(r.phase_ns[0], r.phase_ns[1], r.phase_ns[2]),
        phases_seen=r.phases_seen,
    )
