"""The node's view: a process that plays NCCL through the profiler's C ABI keeps its sums in a
shared file, `autotune_nccl.node` reads it, and ``autotune daemon``'s collector serves it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autotune.metrics import NcclNodeMetrics
from autotune_nccl.node import BOUNDS_NS, PREFIX, read_node

PLAY = """
import sys
from autotune_nccl.played.profiler import ProfiledComm
comm = ProfiledComm("v5", comm_id=0x51, nranks=4)
for ns in (2_000, 2_500, 40_000):  # 3 all-reduces of 1 MiB: 2 us, 2.5 us, 40 us
    comm.collective("AllReduce", 1 << 18, timers=[(1, 1 + ns)], algo="RING", proto="SIMPLE")
comm.collective("AllGather", 100, timers=[(1, 7_001)], algo="RING", proto="LL")
handle = comm.start(comm.coll_event("AllReduce", 8, channels=0))
comm.stop(handle)  # no channel ran: counted, not timed
import os
if os.environ.get("SERVED"):  # a rank exporter of its own serves these
    from autotune_nccl import Profiler
    Profiler().mark_served(int(os.environ["SERVED"]))
print("played", flush=True)
sys.stdin.read()  # until the test is done reading
"""


@pytest.fixture(params=[""])
def player(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    env = {**os.environ, "AUTOTUNE_NCCL_SHM_DIR": str(tmp_path), "RANK": "3",
           "LOCAL_RANK": "1", "AUTOTUNE_JOB": "job-7", "SERVED": request.param}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", PLAY], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "played"
    yield proc, tmp_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_process_keeps_its_sums_where_the_daemon_reads_them(
    player: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, where = player
    [view] = read_node(where)
    assert (view.pid, view.rank, view.local_rank, view.job) == (proc.pid, 3, 1, "job-7")
    assert (view.version, view.records, view.untimed, view.ring_full) == (5, 5, 1, 0)
    cells = {(c.func, c.size_class, c.algorithm, c.protocol, c.nranks): c for c in view.cells}
    ar = cells["AllReduce", 1 << 20, "RING", "SIMPLE", 4]
    assert (ar.count, ar.nbytes, ar.kernel_ns) == (3, 3 << 20, 44_500)
    # 2 us and 2.5 us fall in (1.8 us, 3.2 us]; 40 us in (32 us, 56 us].
    assert ar.buckets[BOUNDS_NS.index(3_200)] == 2 and ar.buckets[BOUNDS_NS.index(56_000)] == 1
    assert sum(ar.buckets) == 3
    ag = cells["AllGather", 512, "RING", "LL", 4]
    assert (ag.count, ag.nbytes, ag.kernel_ns) == (1, 400, 7_000)

    registry = CollectorRegistry()
    registry.register(NcclNodeMetrics(str(where)))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    who = {"pid": str(proc.pid), "rank": "3", "local_rank": "1", "job": "job-7"}
    cell = {**who, "collective": "AllReduce", "size_class": str(1 << 20), "algorithm": "ring",
            "protocol": "Simple"}  # fmt: skip
    assert samples["autotune_nccl_collective_seconds_count", tuple(sorted(cell.items()))] == 3
    busbw = samples["autotune_nccl_busbw_bytes_per_second", tuple(sorted(cell.items()))]
    assert busbw == pytest.approx((3 << 20) * 1.5 / 44.5e-6)  # all-reduce at 4 ranks: 2(n-1)/n
    info = tuple(sorted({**who, "version": "5"}.items()))
    assert samples["autotune_nccl_profiler_info", info] == 1
    if shutil.which("promtool") is not None:
        out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                             text=True)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert list(where.iterdir()) == []  # the process removed its file at exit


@pytest.mark.parametrize("player", ["9410"], indirect=True)
def test_a_process_its_rank_exporter_serves_is_left_out_by_the_daemon(
    player: tuple[subprocess.Popen[str], Path],
) -> None:
    _, where = player
    [view] = read_node(where)
    assert view.served == 9410 and view.records == 5
    registry = CollectorRegistry()
    registry.register(NcclNodeMetrics(str(where)))
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert families["autotune_nccl_collective_seconds"].samples == []
    assert families["autotune_nccl_profiler_info"].samples == []


def test_a_killed_process_file_is_removed_and_a_foreign_file_ignored(
    player: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, where = player
    (where / f"{PREFIX}notapid").write_bytes(b"x")
    (where / f"{PREFIX}{os.getpid()}").write_bytes(b"\0" * 64)  # alive, but no magic yet
    proc.kill()
    proc.wait()
    assert read_node(where) == []
    names = sorted(p.name for p in where.iterdir())
    assert names == sorted([f"{PREFIX}notapid", f"{PREFIX}{os.getpid()}"])  # the dead one's went


def test_a_starting_process_sweeps_the_files_of_processes_that_are_gone(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / f"{PREFIX}{gone.stdout.strip()}").write_bytes(b"\0" * 64)  # its pid is free now
    (tmp_path / f"{PREFIX}{os.getpid()}").write_bytes(b"\0" * 64)  # alive: kept
    env = {**os.environ, "AUTOTUNE_NCCL_SHM_DIR": str(tmp_path)}
    code = "from autotune_nccl.played.profiler import ProfiledComm; ProfiledComm('v6', comm_id=1)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{PREFIX}{os.getpid()}"]


def test_autotune_nccl_shm_0_keeps_no_file(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_NCCL_SHM_DIR": str(tmp_path), "AUTOTUNE_NCCL_SHM": "0"}
    code = (
        "from autotune_nccl.played.profiler import ProfiledComm; "
        "from autotune_nccl import Profiler; c = ProfiledComm('v6', comm_id=1); "
        "c.collective(); print(len(Profiler().drain()))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "1" and list(tmp_path.iterdir()) == []
