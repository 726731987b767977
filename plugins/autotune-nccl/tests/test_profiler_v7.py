"""What NCCL 2.31's profiler v7 adds, through the C ABI as NCCL calls it: the kernel variant,
the symmetric flag and the user tag on each record, symmetric kernels' phases; and what the
plugin costs NCCL's threads (each record's own time) and the sampling knob that bounds it."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from autotune_nccl import Profiler
from autotune_nccl.played.profiler import (
    KERNEL_PHASE_STOP,
    SYMMETRIC_PHASES,
    VERSIONS,
    ProfiledComm,
)


@pytest.fixture
def prof() -> Iterator[Profiler]:
    p = Profiler()
    p.reclaim()
    p.drain()
    yield p
    p.reclaim()
    p.drain()


def test_v7_records_the_variant_the_symmetric_flag_the_tag_and_each_phase(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v7", comm_id=0x731, nranks=8)
    variant = "AllReduce_Sum_bf16_SYM_LD"
    played = comm.collective(
        "AllReduce", 1 << 20, dtype="ncclBfloat16", phases=SYMMETRIC_PHASES, variant=variant,
        symmetric=True, tag=0x5EED,
    )  # fmt: skip
    [r] = prof.drain()
    assert (r.seq, r.version, r.kernel_ns, r.channels_seen) == (played.seq, 7, 51_000, 2)
    assert (r.kernel_variant, r.symmetric, r.user_tag) == (variant, True, 0x5EED)
    # Each phase: its longest channel (channel 0's sync 2 us; channel 1's compute 41 us and
    # final sync 7 us, against channel 0's 27 us and 11 us: the longest of each).
    assert (r.phases_seen, r.phase_ns) == (6, (2_000, 41_000, 11_000))
    after = prof.stats()
    assert (after.orphans, after.ignored - before.ignored) == (before.orphans, 2)  # proxy ops
    comm.finalize()


def test_a_non_symmetric_v7_collective_has_no_phases_and_older_versions_say_nothing(
    prof: Profiler,
) -> None:
    comm = ProfiledComm("v7", comm_id=0x732)
    comm.collective("AllGather", 4096, variant="AllGather_RING_LL", symmetric=False)
    [r] = prof.drain()
    assert (r.kernel_variant, r.symmetric, r.user_tag) == ("AllGather_RING_LL", False, 0)
    assert (r.phases_seen, r.phase_ns) == (0, (0, 0, 0))
    comm.finalize()
    for version in VERSIONS[:-1]:
        old = ProfiledComm(version, comm_id=0x733)
        old.collective("AllReduce", 4096)
        [r] = prof.drain()
        assert (r.kernel_variant, r.symmetric, r.user_tag, r.phases_seen) == ("", None, 0, 0)
        old.finalize()


def test_a_phase_whose_parent_is_not_a_live_channel_is_an_orphan(prof: Profiler) -> None:
    before = prof.stats()
    comm = ProfiledComm("v7", comm_id=0x734)
    comm.phase(ctypes.c_void_p(0xBAD0), 0, 1, 10, 20)  # a parent that is not ours
    handle = comm.start(comm.coll_event("AllReduce", 64, channels=1))
    comm.stop(handle)
    k = comm.start_channel(handle, 0, 100)
    comm.phase(k, 0, 7, 110, 120)  # NCCL has three phases: 7 is not one
    assert comm.api.recordEventState(k, KERNEL_PHASE_STOP, None) == 0  # no args: nothing read
    comm.stop_channel(k, 900)
    [r] = prof.drain()
    assert (r.kernel_ns, r.phases_seen) == (800, 0)
    assert prof.stats().orphans - before.orphans == 2
    comm.finalize()


def test_every_16th_record_of_a_communicator_carries_what_it_cost_nccls_threads(
    prof: Profiler,
) -> None:
    comm = ProfiledComm("v6", comm_id=0x735)
    began = time.monotonic_ns()
    for _ in range(40):
        comm.collective("AllReduce", 1024)
    took = time.monotonic_ns() - began
    got = prof.drain()
    assert len(got) == 40
    # The 1st, 17th and 33rd were timed (reading the clock in every call doubled the plugin's
    # cost): some time in the plugin, all of it within the calls NCCL made.
    assert [r.seq for r in got if r.cost_ns > 0] == [0, 16, 32]
    assert sum(r.cost_ns for r in got) < took
    comm.finalize()


def test_a_communicator_in_a_finalised_ones_slot_counts_its_timed_collectives_afresh(
    prof: Profiler,
) -> None:
    first = ProfiledComm("v6", comm_id=0x736)
    for _ in range(5):
        first.collective("AllReduce", 1024)
    first.finalize()
    # The library takes free slots first: open communicators until one gets the finalised slot.
    opened: list[ProfiledComm] = []
    while not opened or opened[-1].ctx.value != first.ctx.value:
        opened.append(ProfiledComm("v6", comm_id=0x737))
        assert len(opened) <= 256, "the finalised slot was never reused"
    prof.drain()
    again = opened[-1]
    for _ in range(17):
        again.collective("AllReduce", 1024)
    assert [r.seq for r in prof.drain() if r.cost_ns > 0] == [0, 16]
    for comm in opened:
        comm.finalize()


SAMPLED = """
import json
from autotune_nccl import Profiler
from autotune_nccl.played.profiler import ProfiledComm
p = Profiler()
a, b = ProfiledComm("v7", comm_id=0xA), ProfiledComm("v7", comm_id=0xB)
for i in range(10):
    a.collective("AllReduce", 64, phases=[[(1, 2), (2, 3), (3, 4)], [(1, 2), (2, 5), (5, 6)]])
    if i < 7:
        b.collective("AllReduce", 64)
s = p.stats()
print(json.dumps({"seq": [[r.comm_id, r.seq, r.phases_seen] for r in p.drain()],
                  "sampled_out": s.sampled_out, "orphans": s.orphans, "every": s.sample_every}))
"""


def test_sampling_records_exactly_every_nth_collective_of_each_communicator() -> None:
    env = {**os.environ, "AUTOTUNE_NCCL_PROFILER_SAMPLE": "3", "AUTOTUNE_NCCL_SHM": "0"}
    out = subprocess.run(
        [sys.executable, "-c", SAMPLED], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    assert got["every"] == 3
    # The 1st, 4th, 7th, 10th of A and the 1st, 4th, 7th of B, with all their phases.
    assert sorted(map(tuple, got["seq"])) == [
        (0xA, 0, 6), (0xA, 3, 6), (0xA, 6, 6), (0xA, 9, 6), (0xB, 0, 0), (0xB, 3, 0), (0xB, 6, 0),
    ]  # fmt: skip
    # The others are counted; their channels and phases are not orphans.
    assert (got["sampled_out"], got["orphans"]) == (10, 0)
