"""The plugin as NCCL 2.21 to 2.27 call it: the exported ncclTunerPlugin_v2, _v3 and _v4 structs,
whose init names no communicator, and v2, which has no cost table at all (NCCL takes the cell
the plugin writes, unchecked)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from autotune_nccl import Tuner, library_path
from autotune_nccl.played.tuner import (
    LL,
    LL128,
    NUM_ALGO,
    NUM_PROTO,
    RING,
    SIMPLE,
    TREE,
    UNDEF,
    V3,
    V4,
    LegacyComm,
    NcclComm,
    Table,
    changed,
    legacy,
    nccl_table,
)

COLLNET_DIRECT, NVLS = 2, 4


@pytest.mark.parametrize("version", ["v2", "v3", "v4", "v5", "v6", "v7"])
def test_every_tuner_symbol_from_nccl_2_21_on_is_exported(version: str) -> None:
    lib = ctypes.CDLL(library_path())
    assert ctypes.c_char_p.in_dll(lib, f"ncclTunerPlugin_{version}").value == b"autotune"


@pytest.mark.parametrize("version", ["v3", "v4"])
def test_v3_and_v4_steer_exactly_the_armed_cell(tuner: Tuner, version: str) -> None:
    api = legacy(version)
    assert isinstance(api, V3 | V4)
    comm = LegacyComm(api)
    tuner.arm("ring", "LL128", channels=4)
    table, channels = comm.coll_info(1 << 20)
    assert changed(table) == {(RING, LL128): 0.0} and channels == 4
    report = tuner.last()
    assert (report.source, report.applied, report.comm_id) == ("driven", True, 0)
    # The next all-reduce is NCCL's own again.
    table, channels = comm.coll_info(1 << 20)
    assert changed(table) == {} and channels == -1
    comm.close()


def test_a_choice_for_one_communicator_never_applies_where_nccl_names_none(tuner: Tuner) -> None:
    # v2-v4 give no communicator id: a choice armed for communicator 7 waits, untaken.
    comm = LegacyComm(legacy("v4"))
    tuner.arm("tree", "Simple", comm_id=7)
    table, _ = comm.coll_info(1 << 20)
    assert changed(table) == {} and tuner.armed
    comm.close()


def test_v3_reads_the_table_without_regbuff(tuner: Tuner, tmp_path: Path) -> None:
    csv = tmp_path / "nccl_tuner.conf"
    csv.write_text("allreduce,0,65536,tree,ll,2\nallreduce,65537,1073741824,ring,simple,-1\n")
    assert tuner.load_table(csv) == 2
    comm = LegacyComm(legacy("v3"))
    table, channels = comm.coll_info(4096)
    assert changed(table) == {(TREE, LL): 0.0} and channels == 2
    table, channels = comm.coll_info(1 << 24)
    assert changed(table) == {(RING, SIMPLE): 0.0} and channels == -1
    assert tuner.last().source == "table"
    comm.close()


def test_v2_writes_the_cell_and_offers_only_what_nccl_2_21_can_always_run(tuner: Tuner) -> None:
    comm = LegacyComm(legacy("v2"))
    # Nothing armed: the outputs stay NCCL's own (undefined: NCCL picks).
    assert comm.cell(1 << 20) == (UNDEF, UNDEF, 0)
    tuner.arm("ring", "Simple", channels=8)
    assert comm.cell(1 << 20) == (RING, SIMPLE, 8)
    report = tuner.last()
    assert report.applied and ("tree", "LL") in report.usable
    assert ("ring", "LL128") not in report.usable and ("pat", "Simple") not in report.usable
    # LL128 depends on the GPU, which v2 does not say: refused, left to NCCL.
    tuner.arm("tree", "LL128")
    assert comm.cell(1 << 20) == (UNDEF, UNDEF, 0) and tuner.last().refused
    # CollNet and NVLS only where NCCL says it supports them.
    tuner.arm("collnet_direct", "Simple")
    assert comm.cell(1 << 20) == (UNDEF, UNDEF, 0)
    tuner.arm("collnet_direct", "Simple")
    assert comm.cell(1 << 20, collnet=True) == (COLLNET_DIRECT, SIMPLE, 0)
    tuner.arm("nvls", "Simple")
    assert comm.cell(1 << 20, nvls=True) == (NVLS, SIMPLE, 0)
    comm.close()


def _unusable() -> Table:
    return nccl_table(tuple((a, p) for a in range(NUM_ALGO) for p in range(NUM_PROTO)))


@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6", "v7"])
def test_a_cost_table_unusable_everywhere_is_left_to_nccl_without_an_error(
    tuner: Tuner, version: str
) -> None:
    # NCCL wraps getCollInfo in NCCLCHECK: an error would fail the user's collective.
    tuner.arm("ring", "Simple", channels=4)
    if version in ("v3", "v4"):
        api = legacy(version)
        assert isinstance(api, V3 | V4)
        comm: LegacyComm | NcclComm = LegacyComm(api)
    else:
        from autotune_nccl.played.tuner import V5, V6

        kind = V5 if version == "v5" else V6
        comm = NcclComm(kind.in_dll(ctypes.CDLL(library_path()), f"ncclTunerPlugin_{version}"), 3)
    table, channels = comm.coll_info(1 << 20, table=_unusable())
    assert all(table[a][p] == -1.0 for a in range(NUM_ALGO) for p in range(NUM_PROTO))
    assert channels == -1
    report = tuner.last()
    assert report.refused and not report.applied and report.usable == frozenset()
    comm.close()
