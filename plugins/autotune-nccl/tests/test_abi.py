"""The plugin through its C ABI, called as NCCL calls it: the exported ncclTunerPlugin_v6 and _v5
structs' init, getCollInfo, getChunkSize and finalize, on cost tables built here."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest

from autotune_nccl import Tuner, library_path
from autotune_nccl.played.tuner import (
    ALLGATHER,
    LL,
    LL128,
    NUM_ALGO,
    NUM_PROTO,
    NVLS,
    RING,
    SIMPLE,
    TREE,
    V5,
    V6,
    NcclComm,
    changed,
    constants_struct,
    nccl_table,
    v6,
)


@pytest.fixture(params=["v6", "v5", "v7"])
def api(request: pytest.FixtureRequest) -> V5 | V6:
    lib = ctypes.CDLL(library_path())
    kind = V5 if request.param == "v5" else V6
    return kind.in_dll(lib, f"ncclTunerPlugin_{request.param}")


def test_the_library_exports_each_version_nccl_looks_for(api: V5 | V6) -> None:
    assert api.name == b"autotune"
    comm = NcclComm(api, comm_id=1)
    comm.close()


@pytest.mark.parametrize(("version", "nbytes"), [("v5", 1152), ("v6", 1152), ("v7", 1272)])
def test_init_is_given_nccls_constants_and_leaves_them_as_they_are(
    tuner: Tuner, version: str, nbytes: int
) -> None:
    # NCCL 2.31's tuner_v7.h gives init ncclTunerConstants_v7_t, whose bandwidth tables have
    # five compute-capability rows (NCCL_NUM_COMPCAPS_V7) where v5 and v6 have four: 1272 bytes
    # against 1152. The plugin reads none of them and must write none.
    kind = V5 if version == "v5" else V6
    api = kind.in_dll(ctypes.CDLL(library_path()), f"ncclTunerPlugin_{version}")
    constants = constants_struct(version)()
    assert ctypes.sizeof(constants) == nbytes
    raw = (ctypes.c_double * (nbytes // 8)).from_buffer(constants)
    for i in range(len(raw)):
        raw[i] = 0.5 + i
    before = bytes(constants)
    comm = NcclComm(api, comm_id=0x77, constants=constants)
    tuner.arm("ring", "LL128")
    table, _ = comm.coll_info(1 << 20)
    comm.close()
    assert changed(table) == {(RING, LL128): 0.0}
    assert bytes(constants) == before


def test_a_driven_choice_sets_exactly_its_cell_to_zero(tuner: Tuner, api: V5 | V6) -> None:
    comm = NcclComm(api, comm_id=7)
    tuner.arm("ring", "LL128", channels=4)
    assert tuner.armed
    table, channels = comm.coll_info(1 << 20)
    assert changed(table) == {(RING, LL128): 0.0} and channels == 4
    report = tuner.last()
    assert (report.source, report.applied, report.refused) == ("driven", True, False)
    assert (report.algorithm, report.protocol, report.comm_id) == ("ring", "LL128", 7)
    # NCCL's usable combinations are reported: all but the two -1 cells.
    assert len(report.usable) == NUM_ALGO * NUM_PROTO - 2
    assert ("nvls", "LL") not in report.usable and ("nvls", "Simple") in report.usable
    # One call only: the next all-reduce is NCCL's own again.
    assert not tuner.armed
    table, channels = comm.coll_info(1 << 20)
    assert changed(table) == {} and channels == -1
    assert tuner.last().source == "none"
    comm.close()


def test_a_choice_nccl_marked_unusable_is_refused_and_reported(tuner: Tuner) -> None:
    comm = NcclComm(v6(), comm_id=1)
    tuner.arm("nvls", "LL", channels=2)
    table, channels = comm.coll_info(4096)
    assert changed(table) == {} and channels == -1  # never forced
    report = tuner.last()
    assert report.refused and not report.applied and report.algorithm == "nvls"
    comm.close()


def test_without_a_choice_or_a_table_nccls_table_is_untouched(tuner: Tuner, api: V5 | V6) -> None:
    comm = NcclComm(api, comm_id=1)
    for nbytes in (8, 1 << 20, 1 << 30):
        table, channels = comm.coll_info(nbytes)
        assert changed(table) == {} and channels == -1
    # Nor is any other collective, armed or not: the choice waits for an all-reduce.
    tuner.arm("tree", "Simple")
    table, _ = comm.coll_info(1 << 20, func=ALLGATHER)
    assert changed(table) == {} and tuner.armed
    comm.close()


def test_a_choice_for_one_communicator_leaves_another_untouched(tuner: Tuner) -> None:
    api = v6()
    ours, theirs = NcclComm(api, comm_id=0xA070), NcclComm(api, comm_id=0xBEEF)
    tuner.arm("tree", "LL", comm_id=0xA070)
    table, _ = theirs.coll_info(1 << 16)
    assert changed(table) == {} and tuner.armed  # still waiting for its communicator
    table, _ = ours.coll_info(1 << 16)
    assert changed(table) == {(TREE, LL): 0.0} and not tuner.armed
    ours.close()
    theirs.close()


def test_concurrent_threads_keep_their_own_choices(tuner: Tuner) -> None:
    api = v6()
    comm = NcclComm(api, comm_id=3)
    barrier = threading.Barrier(3)
    got: dict[str, dict[tuple[int, int], float]] = {}

    def worker(name: str, algorithm: str | None, protocol: str) -> None:
        t = Tuner()
        if algorithm is not None:
            t.arm(algorithm, protocol)
        barrier.wait()  # all armed (or not) before any asks
        table, _ = comm.coll_info(1 << 20)
        got[name] = changed(table)

    threads = [
        threading.Thread(target=worker, args=("ring", "ring", "Simple")),
        threading.Thread(target=worker, args=("tree", "tree", "LL")),
        threading.Thread(target=worker, args=("ddp", None, "")),  # another thread's all-reduce
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"ring": {(RING, SIMPLE): 0.0}, "tree": {(TREE, LL): 0.0}, "ddp": {}}
    comm.close()


def test_a_driven_chunk_size_applies_to_the_call_that_chose_it(tuner: Tuner) -> None:
    api = v6()
    comm = NcclComm(api, comm_id=5)
    tuner.arm("ring", "Simple", chunk_bytes=1 << 19)
    comm.coll_info(1 << 24)
    assert comm.chunk(RING, SIMPLE) == 1 << 19
    assert comm.chunk(RING, SIMPLE) == 131072  # the next call: NCCL's own
    # NCCL chose something else than the choice (another cell was cheaper): not applied.
    tuner.arm("ring", "Simple", chunk_bytes=1 << 19)
    comm.coll_info(1 << 24)
    assert comm.chunk(TREE, SIMPLE) == 131072
    comm.close()


def write_table(path: Path, rows: list[str]) -> Path:
    path.write_text(
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
        "numPipeOps,regBuff\n" + "\n".join(rows) + "\n"
    )
    return path


def test_the_table_picks_by_size_range_and_shape(tuner: Tuner, tmp_path: Path) -> None:
    path = write_table(
        tmp_path / "t.csv",
        [
            "allreduce,0,65536,tree,ll,-1,-1,-1,-1,-1",
            "allreduce,65537,16777216,ring,simple,8,1,8,-1,-1",
            "allreduce,65537,16777216,ring,ll128,-1,2,16,-1,-1",  # another shape
            "allgather,0,1048576,ring,ll,-1",
        ],
    )
    assert tuner.load_table(path) == 4 and tuner.table_rows == 4
    api = v6()
    one, two = (
        NcclComm(api, comm_id=1, ranks=8, nodes=1),
        NcclComm(api, comm_id=2, ranks=16, nodes=2),
    )
    assert changed(one.coll_info(4096)[0]) == {(TREE, LL): 0.0}
    assert tuner.last().source == "table"
    table, channels = one.coll_info(1 << 20)
    assert changed(table) == {(RING, SIMPLE): 0.0} and channels == 8
    assert changed(two.coll_info(1 << 20)[0]) == {(RING, LL128): 0.0}
    assert changed(one.coll_info(1 << 30)[0]) == {}  # beyond every range: NCCL's own
    assert changed(one.coll_info(4096, func=ALLGATHER)[0]) == {(RING, LL): 0.0}
    # A driven choice takes precedence over the table for its call.
    tuner.arm("tree", "Simple")
    assert changed(one.coll_info(4096)[0]) == {(TREE, SIMPLE): 0.0}
    # A table row NCCL cannot run is refused like a driven choice.
    table, _ = one.coll_info(4096, table=nccl_table(((TREE, LL), (NVLS, LL), (NVLS, LL128))))
    assert changed(table) == {(TREE, LL): -1.0} and tuner.last().refused
    assert tuner.load_table(None) == 0
    assert changed(one.coll_info(4096)[0]) == {}
    one.close()
    two.close()


def test_a_bad_table_is_refused_naming_the_line(tuner: Tuner, tmp_path: Path) -> None:
    bad = write_table(tmp_path / "bad.csv", ["allreduce,0,100,ring,ll", "x"])
    with pytest.raises(ValueError, match=r"bad\.csv:2: need at least 6 fields"):
        tuner.load_table(bad)
    unknown = write_table(tmp_path / "u.csv", ["allreduce,0,100,hypercube,ll,-1"])
    with pytest.raises(ValueError, match=r"u\.csv:2: unknown collective, algorithm"):
        tuner.load_table(unknown)
    with pytest.raises(ValueError, match="No such file"):
        tuner.load_table(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="'hypercube' is not one of"):
        tuner.arm("hypercube", "LL")


def test_autotune_shows_a_plan_as_a_table_the_plugin_reads(tuner: Tuner, tmp_path: Path) -> None:
    from autotune.plan import Choice, Entry, Table

    plan = Table(
        {
            64 << 10: Entry(Choice("tree"), state="locked"),
            4 << 20: Entry(Choice("ring")),
            64 << 20: Entry(Choice("nccl.ring.ll128"), state="locked"),  # a tuned NCCL cell
        },
        None,
        None,
    )
    path = tmp_path / "plan.csv"
    path.write_text(plan.nccl_csv(n_nodes=1, n_ranks=8))
    assert tuner.load_table(path) == 3
    comm = NcclComm(v6(), 1, ranks=8)
    assert changed(comm.coll_info(40 << 10)[0]) == {(TREE, LL): 0.0}
    assert changed(comm.coll_info(3 << 20)[0]) == {(RING, SIMPLE): 0.0}
    assert changed(comm.coll_info(40 << 20)[0]) == {(RING, LL128): 0.0}
    comm.close()


@pytest.mark.distributed
def test_the_table_in_the_environment_is_read_at_the_first_init(tmp_path: Path) -> None:
    # A fresh process: the environment's table is read once, at NCCL's first init.
    import subprocess
    import sys

    path = write_table(tmp_path / "env.csv", ["allreduce,0,1024,ring,ll,-1"])
    code = (
        "import ctypes, autotune_nccl as a\n"
        "lib = ctypes.CDLL(a.library_path())\n"
        "print(a.Tuner().table_rows, end=' ')\n"
        "init = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,"
        " ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)"
        ".from_address(ctypes.addressof(ctypes.c_char_p.in_dll(lib, 'ncclTunerPlugin_v6')) + 8)\n"
        "ctx = ctypes.c_void_p()\n"
        "assert init(ctypes.byref(ctx), 1, 2, 1, None, None, None) == 0\n"
        "print(a.Tuner().table_rows)\n"
    )
    env = {"AUTOTUNE_NCCL_TABLE": str(path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]
    assert Tuner().environ() == {"NCCL_TUNER_PLUGIN": library_path()}
