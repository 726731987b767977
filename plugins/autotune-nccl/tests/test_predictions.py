"""The tuner keeps NCCL's own prediction (its cost table before any steering) per communicator,
collective and size, and never fails NCCL's call: played through the C ABI as NCCL calls it."""

from __future__ import annotations

import ctypes

from autotune_nccl import Tuner
from autotune_nccl.played.tuner import (
    ALLGATHER,
    LL,
    LL128,
    NUM_ALGO,
    NUM_PROTO,
    RING,
    SIMPLE,
    TREE,
    NcclComm,
    Table,
    legacy,
    nccl_table,
    v6,
)


def test_nccls_table_is_kept_before_the_choice_touches_it(tuner: Tuner) -> None:
    comm = NcclComm(v6(), comm_id=0xAB, ranks=4, nodes=2)
    table = nccl_table()
    table[TREE][LL] = 3.5  # NCCL's model: tree/LL is cheapest
    tuner.arm("ring", "Simple")
    steered, _ = comm.coll_info(1 << 20, table)
    assert steered[RING][SIMPLE] == 0.0  # the call was steered ...
    comm.coll_info(1 << 20)  # ... the next one not; and a second size, and a gather
    comm.coll_info(4096)
    comm.coll_info(1 << 16, func=ALLGATHER)
    preds, dropped = tuner.predictions()
    assert dropped == 0
    by_key = {(p.func, p.nbytes): p for p in preds}
    assert set(by_key) == {("AllReduce", 1 << 20), ("AllReduce", 4096), ("AllGather", 1 << 16)}
    p = by_key["AllReduce", 1 << 20]
    assert (p.comm_id, p.nranks, p.nnodes, p.calls) == (0xAB, 4, 2, 2)
    # The last call's table, as NCCL filled it (the untouched one): nvls LL and LL128 unusable.
    assert p.cost_us[("ring", "Simple")] == 10.0 + RING * NUM_PROTO + SIMPLE
    assert ("nvls", "LL") not in p.cost_us and len(p.cost_us) == NUM_ALGO * NUM_PROTO - 2
    assert p.nccl_choice == ("tree", "LL") and p.steered is None
    comm.close()


def test_the_steered_cell_is_kept_and_nccls_choice_is_its_own(tuner: Tuner) -> None:
    comm = NcclComm(v6(), comm_id=0xAC)
    table = nccl_table()
    table[TREE][LL] = 3.5
    tuner.arm("ring", "LL128")
    comm.coll_info(1 << 20, table)
    [p], _ = tuner.predictions()
    assert p.steered == ("ring", "LL128") and p.nccl_choice == ("tree", "LL")
    assert p.cost_us[("tree", "LL")] == 3.5 and p.cost_us[("ring", "LL128")] == 10.0 + 4
    comm.close()


def test_a_table_of_minus_one_everywhere_is_left_to_nccl(tuner: Tuner) -> None:
    comm = NcclComm(v6(), comm_id=0xAD)
    table = Table()
    for a in range(NUM_ALGO):
        for p in range(NUM_PROTO):
            table[a][p] = -1.0
    tuner.arm("ring", "LL128", channels=8)
    out, channels = comm.coll_info(1 << 20, table)
    assert all(out[a][p] == -1.0 for a in range(NUM_ALGO) for p in range(NUM_PROTO))
    assert channels == -1 and tuner.last().refused and not tuner.armed
    [pred], _ = tuner.predictions()
    assert pred.cost_us == {} and pred.nccl_choice is None and pred.steered is None
    comm.close()


def test_get_coll_info_never_returns_an_error(tuner: Tuner) -> None:
    api = v6()
    channels = ctypes.c_int(-1)
    table = nccl_table()
    # No context (an init that could not allocate), no table, no algorithms, a collective NCCL
    # added later: each returns ncclSuccess and touches nothing.
    for ctx, tab, algos, func in (
        (None, ctypes.addressof(table), NUM_ALGO, 4),
        (NcclComm(api, 1).ctx, None, NUM_ALGO, 4),
        (NcclComm(api, 2).ctx, ctypes.addressof(table), 0, 4),
        (NcclComm(api, 3).ctx, ctypes.addressof(table), NUM_ALGO, 11),
    ):
        rc = api.getCollInfo(ctx, func, 1024, 1, tab, algos, NUM_PROTO, 0, ctypes.byref(channels))
        assert rc == 0
    assert api.getChunkSize(None, 4, 1024, RING, LL128, 2, None) == 0
    v2 = legacy("v2")
    a, p, c = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(0)
    assert v2.getCollInfo(None, 4, 1024, 0, 0, 1, ctypes.byref(a), ctypes.byref(p), None) == 0
    assert v2.getCollInfo(None, 4, 1024, 0, 0, 1, None, None, ctypes.byref(c)) == 0
    assert (a.value, p.value, c.value) == (-1, -1, 0)
    assert table[RING][LL128] == nccl_table()[RING][LL128]


def test_v2_has_no_table_of_nccls_so_it_predicts_nothing(tuner: Tuner) -> None:
    from autotune_nccl.played.tuner import LegacyComm

    comm = LegacyComm(legacy("v2"))
    tuner.arm("ring", "Simple")
    assert comm.cell(1 << 20)[:2] == (RING, SIMPLE)
    assert tuner.predictions() == ([], 0)
    comm.close()
