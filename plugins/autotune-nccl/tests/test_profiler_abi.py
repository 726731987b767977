"""The profiler plugin through its C ABI, played as NCCL 2.26 (v3), 2.27 (v4), 2.28 (v5), 2.30
(v6) and 2.31 (v7) call it, then drained through autotune_nccl.Profiler. The library's state is
the process's: each test drains first and compares counters before and after."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from autotune_nccl import Profiler, ProfilerStats
from autotune_nccl.played.profiler import (
    COLL,
    KERNEL_CH,
    KERNEL_PHASE,
    VERSIONS,
    ProfiledComm,
    profiler,
)


@pytest.fixture
def prof() -> Iterator[Profiler]:
    p = Profiler()
    p.reclaim()  # nothing left over from another test
    p.drain()
    yield p
    p.reclaim()
    p.drain()


def delta(after: ProfilerStats, before: ProfilerStats) -> dict[str, int]:
    return {
        k: getattr(after, k) - getattr(before, k)
        for k in ("records", "ring_full", "pool_full", "stale", "orphans", "late", "ignored")
        if getattr(after, k) != getattr(before, k)
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_each_symbol_records_a_collective_with_its_kernel_time(
    prof: Profiler, version: str
) -> None:
    before = prof.stats()
    comm = ProfiledComm(version, comm_id=0xC0FFEE, nranks=4, rank=1, nnodes=2)
    # Collectives and kernel channels, and from v7 (NCCL 2.31) symmetric kernels' phases.
    assert comm.mask == COLL | KERNEL_CH | (KERNEL_PHASE if version == "v7" else 0)
    assert profiler(version).name == b"autotune"
    t0 = time.monotonic_ns()
    played = comm.collective("AllReduce", count=1 << 18, algo="RING", proto="LL128")
    elapsed = time.monotonic_ns() - t0
    [r] = prof.drain()
    assert (r.comm_id, r.seq, r.func, r.dtype) == (0xC0FFEE, played.seq, "AllReduce", "ncclFloat32")
    assert (r.count, r.nbytes, r.algorithm, r.protocol) == (1 << 18, 1 << 20, "RING", "LL128")
    assert (r.channels, r.channels_seen, r.incomplete) == (2, 2, False)
    assert r.version == int(version[1]) and r.rank == 1
    if version == "v3":  # no GPU timer before NCCL 2.27: the host's clock, at the proxy's events
        assert r.clock == "host" and (r.nranks, r.nnodes) == (0, 0)
        assert 0 < r.kernel_ns <= elapsed and 0 < r.longest_ns <= r.kernel_ns
    else:  # first channel start (1 us) to last channel stop (52 us), NCCL's GPU timer in ns
        assert r.clock == "gpu" and (r.nranks, r.nnodes) == (4, 2)
        assert (r.kernel_ns, r.longest_ns) == (51_000, 49_000)
    # One group-less proxy op per channel was offered and ignored; nothing lost.
    assert delta(prof.stats(), before) == {"records": 1, "ignored": 2}
    comm.finalize()


def test_a_stop_without_a_start_and_a_stop_twice_are_counted_not_fatal(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v6", comm_id=1)
    comm.stop(0x1234)  # a handle that was never ours
    comm.stop(None)  # what NCCL passes for an event the plugin declined
    handle = comm.start(comm.coll_event("AllReduce", 1024, channels=0))
    comm.stop(handle)
    comm.stop(handle)  # twice
    comm.record_stop(ctypes.c_void_p(0x5678), 99)  # a state for a handle that is not ours
    stray = comm.start_channel(0xBEEF, 0, 10)  # a channel whose parent is not ours
    assert stray.value is None
    comm.stop_channel(stray, 20)
    [r] = prof.drain()  # the collective without channels, recorded at its stop, with no time
    assert (r.nbytes, r.channels, r.clock, r.kernel_ns) == (4096, 0, "none", 0)
    assert delta(prof.stats(), before) == {"records": 1, "orphans": 4}
    assert prof.stats().in_flight == before.in_flight
    comm.finalize()


def test_two_communicators_interleaved_keep_their_own_records(prof: Profiler) -> None:
    a, b = ProfiledComm("v5", comm_id=0xA), ProfiledComm("v5", comm_id=0xB, nranks=8)
    ha = a.start(a.coll_event("AllReduce", 100, channels=2))
    hb = b.start(b.coll_event("AllGather", 200, algo="NVLS", channels=1))
    a.stop(ha)
    b.stop(hb)
    ka0 = a.start_channel(ha, 0, 1_000)
    kb0 = b.start_channel(hb, 0, 5_000)
    ka1 = a.start_channel(ha, 1, 2_000)
    b.stop_channel(kb0, 9_000)  # b completes between a's channels
    a.stop_channel(ka1, 30_000)
    a.stop_channel(ka0, 20_000)
    got = {r.comm_id: r for r in prof.drain()}
    assert set(got) == {0xA, 0xB}
    assert (got[0xA].func, got[0xA].nbytes, got[0xA].kernel_ns, got[0xA].nranks) == (
        "AllReduce", 400, 29_000, 2,
    )  # fmt: skip
    assert (got[0xB].func, got[0xB].algorithm, got[0xB].kernel_ns, got[0xB].nranks) == (
        "AllGather", "NVLS", 4_000, 8,
    )  # fmt: skip
    a.finalize()
    b.finalize()


def test_events_after_finalize_are_counted_and_a_collective_in_flight_still_lands(
    prof: Profiler,
) -> None:
    before = prof.stats()
    comm = ProfiledComm("v6", comm_id=0xF)
    handle = comm.start(comm.coll_event("AllReduce", 256, channels=1))
    comm.stop(handle)
    k = comm.start_channel(handle, 0, 100)
    comm.finalize()
    comm.stop_channel(k, 700)  # the kernel was already running: its record is kept
    late = comm.start(comm.coll_event("AllReduce", 256))
    assert late.value is None
    comm.finalize()  # twice
    [r] = prof.drain()
    assert (r.comm_id, r.kernel_ns) == (0xF, 600)
    assert delta(prof.stats(), before) == {"records": 1, "late": 2}


def test_a_full_ring_counts_its_drops_and_flows_again_once_drained(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v6", comm_id=0x717)
    extra = 10
    for _ in range(prof.ring_capacity + extra):
        comm.collective("AllReduce", 64, timers=[(1, 2)])
    assert delta(prof.stats(), before) == {
        "records": prof.ring_capacity, "ring_full": extra, "ignored": prof.ring_capacity + extra,
    }  # fmt: skip
    assert prof.stats().lost - before.lost == extra
    got = prof.drain()
    assert [r.seq for r in got] == list(range(prof.ring_capacity))  # in order, none twice
    comm.collective("AllReduce", 64, timers=[(1, 2)])
    assert [r.seq for r in prof.drain()] == [prof.ring_capacity + extra]
    comm.finalize()


def test_a_full_pool_counts_what_it_could_not_track(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v5", comm_id=0x9001)
    handles = [comm.start(comm.coll_event("AllReduce", 8)) for _ in range(prof.pool_capacity + 3)]
    assert sum(h.value is None for h in handles) == 3
    assert prof.stats().in_flight - before.in_flight == prof.pool_capacity
    for ch, h in enumerate(handles):
        comm.stop(h)
        for c in range(2):
            comm.stop_channel(comm.start_channel(h, c, 10), 10 + ch + 1)
    assert len(prof.drain()) == prof.pool_capacity
    assert delta(prof.stats(), before)["pool_full"] == 3
    assert prof.stats().in_flight == before.in_flight
    comm.finalize()


def test_channels_that_never_come_are_recorded_incomplete_on_reclaim(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v6", comm_id=0x5)
    handle = comm.start(comm.coll_event("ReduceScatter", 1024, channels=4))
    comm.stop(handle)
    for ch in range(2):  # NCCL announced 4 channels; 2 ran
        comm.stop_channel(comm.start_channel(handle, ch, 100 * (ch + 1)), 1_000 * (ch + 1))
    assert prof.drain() == []
    prof.reclaim(idle_s=3600)  # not idle that long: kept waiting
    assert prof.drain() == []
    prof.reclaim()
    [r] = prof.drain()
    assert (r.incomplete, r.channels, r.channels_seen, r.kernel_ns) == (True, 4, 2, 1_900)
    assert delta(prof.stats(), before) == {"records": 1, "stale": 1}
    assert prof.stats().in_flight == before.in_flight
    comm.finalize()


def test_a_bad_channel_id_and_a_missing_timer_fall_back_without_a_crash(prof: Profiler) -> None:
    comm = ProfiledComm("v6", comm_id=0x6)
    handle = comm.start(comm.coll_event("AllReduce", 1024, channels=2))
    comm.stop(handle)
    assert comm.start_channel(handle, 200, 5).value is None  # beyond NCCL's 64 channels
    k0 = comm.start_channel(handle, 0, 0)  # a GPU timer NCCL could not read
    k1 = comm.start_channel(handle, 1, 10)
    assert comm.api.recordEventState(k1, 22, None) == 0  # no arguments: nothing to read
    comm.stop_channel(k0, 50)
    comm.stop_channel(k1, 60)
    [r] = prof.drain()
    assert r.clock == "host" and r.channels_seen == 2  # one channel had no timer: host for all
    comm.finalize()


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_all_64_channels_and_the_slot_reused_after_them(prof: Profiler, version: str) -> None:
    # NCCL 2.30.7 on an H200 ran tree/LL at 256 KiB on all 64 channels (MAXCHANNELS); a loop
    # over the channel bits that shifted a uint64_t by 64 ran off the channel array there and
    # took the process down (docs/BENCHMARKS.md, "On a GPU"). Channel 63 must count, and the
    # slot must come back clean for the next collective.
    comm = ProfiledComm(version, comm_id=0x64)
    timers = [(1_000 + ch, 50_000 + ch) for ch in range(64)]
    played = comm.collective("AllReduce", count=1 << 16, algo="TREE", proto="LL", timers=timers)
    [r] = prof.drain()
    assert (r.seq, r.channels, r.channels_seen, r.incomplete) == (played.seq, 64, 64, False)
    assert (r.clock, r.kernel_ns, r.longest_ns) == ("gpu", 50_063 - 1_000, 49_000)
    # Every slot of the pool once more: each starts from cleared channels, channel 63 too.
    for _ in range(prof.pool_capacity):
        comm.collective("AllReduce", count=1024, timers=[(10, 20)])
    got = prof.drain()
    assert len(got) == prof.pool_capacity
    assert {(x.channels_seen, x.kernel_ns) for x in got} == {(1, 10)}
    comm.finalize()


def test_producers_on_many_threads_lose_nothing_uncounted(prof: Profiler) -> None:
    before = prof.stats()
    threads, per_thread = 4, 3000
    comms = [ProfiledComm("v6", comm_id=0x100 + t) for t in range(threads)]
    drained: list[int] = []
    done = threading.Event()

    def play(comm: ProfiledComm) -> None:
        for _ in range(per_thread):
            comm.collective("AllReduce", 16, timers=[(1, 3), (2, 4)])

    def drain() -> None:
        while not done.is_set():
            drained.extend(r.comm_id for r in prof.drain())
        drained.extend(r.comm_id for r in prof.drain())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    workers = [threading.Thread(target=play, args=(c,), daemon=True) for c in comms]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    reader.join()
    d = delta(prof.stats(), before)
    assert d["records"] + d.get("ring_full", 0) == threads * per_thread
    assert len(drained) == d["records"]
    assert d.get("orphans", 0) == 0 and d.get("pool_full", 0) == 0
    assert prof.stats().in_flight == before.in_flight
    for c in comms:
        c.finalize()


def test_autotune_nccl_profiler_0_loads_but_asks_nccl_for_nothing() -> None:
    code = (
        "from autotune_nccl.played.profiler import ProfiledComm; "
        "print(ProfiledComm('v6', comm_id=1).mask)"
    )
    env = {**os.environ, "AUTOTUNE_NCCL_PROFILER": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0"


def test_stats_lost_is_what_no_record_will_show() -> None:
    s = ProfilerStats(6, 1, 1, 5, 5, 2, 3, 0, 0, 0, 0, 0, 66, 0, 0, 0, 0, 1)
    assert s.lost == 5 and replace(s, ring_full=0).lost == 3
