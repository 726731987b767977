"""The tuner driving NCCL's own algorithm x protocol through the plugin, on 2 gloo ranks whose
"NCCL" asks the plugin through its C ABI as NCCL does (tests/nccl_jobs.py)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
from nccl_jobs import (
    FAST,
    offered_on_fake_nccl,
    offered_on_gloo,
    tune_on_fake_nccl,
    unhook_on_fake_nccl,
)

from autotune.algorithms import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    available,
    carried,
    carry,
    get_algorithm_class,
)
from autotune.comm.launch import run_local
from autotune.plan import Choice
from autotune_nccl import ALGORITHMS, PROTOCOLS
from autotune_nccl.algorithms import COMBINATIONS
from autotune_nccl.played.tuner import LL, LL128, RING, TREE, NcclComm, changed, v6

BUILTIN_NAMES = tuple(cls.name for cls in BUILTINS)


def test_every_cell_of_nccls_table_is_an_algorithm_autotune_finds() -> None:
    assert len(COMBINATIONS) == len(ALGORITHMS) * len(PROTOCOLS)
    ours = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name in COMBINATIONS}
    assert set(ours) == set(COMBINATIONS)  # pyproject's entry points and the module agree
    for name, cls in COMBINATIONS.items():
        assert name in available() and get_algorithm_class(name) is cls
        assert ours[name].load() is cls
        assert name == f"nccl.{cls.nccl_algorithm}.{cls.nccl_protocol.lower()}"
    assert "nccl.ring.ll128" in COMBINATIONS and "nccl.nvls_tree.simple" in COMBINATIONS


@pytest.mark.distributed
def test_on_gloo_nothing_asks_the_plugin_so_no_nccl_choice_is_offered() -> None:
    for rank, got in enumerate(run_local(offered_on_gloo, 2, timeout_s=120)):
        assert got["candidates"] == BUILTIN_NAMES, rank
        assert got["sum"] == [3.0] * 1000  # the backend's all-reduce ran, steering nothing
        assert got["asked"] == 0 and not got["armed"]


@pytest.mark.distributed
def test_nccls_usable_combinations_join_auto_agreed_by_every_rank() -> None:
    # Every rank's NCCL marks NVLS and PAT unusable; rank 1's also ring/LL and tree/Simple.
    got = run_local(offered_on_fake_nccl, 2, ["ring/LL", "tree/Simple"], timeout_s=120)
    usable = sorted(
        f"nccl.{a}.{p.lower()}"
        for a in ("tree", "ring", "collnet_direct", "collnet_chain")
        for p in PROTOCOLS
        if (a, p) not in {("ring", "LL"), ("tree", "Simple")}
    )
    for rank, mine in enumerate(got):
        assert mine["auto"] == BUILTIN_NAMES + tuple(usable), rank
        # What the user named is cut the same way, in the user's order.
        assert mine["given"] == ("ring",), rank
        assert mine["probes"] == 1  # one all-reduce asked NCCL what it offers
    assert got[0] == got[1]


@pytest.mark.distributed
def test_the_tuner_finds_the_combination_that_makes_the_step_faster(tmp_path: Path) -> None:
    # NCCL's own choice (the baseline) and every other cell cost a delay; ring/LL128 does not.
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    got = run_local(tune_on_fake_nccl, 2, storage, 600, timeout_s=600)
    for rank, r in enumerate(got):
        # nvls is unusable on this "machine": never a candidate.
        assert r.candidates == ("nccl.ring.ll128", "nccl.tree.simple"), rank
        assert r.settled and not r.baseline_kept, (rank, r.plan)
        assert r.plan and {c.algorithm for c in r.plan.values()} == {"nccl.ring.ll128"}
        # Each choice ran exactly the cell it names, and native ran NCCL's own (tree/LL).
        assert r.ran["nccl.ring.ll128"] == {FAST}, r.ran
        assert r.ran.get("nccl.tree.simple", {("tree", "Simple")}) == {("tree", "Simple")}
        assert r.ran["native"] == {("tree", "LL")}, r.ran
        assert not r.armed_after
        assert r.same_as_rank0


@pytest.mark.usefixtures("tuner")
def test_unhooked_the_tuned_cells_run_from_the_table_on_every_later_all_reduce() -> None:
    # What autotune hands NCCL as it unhooks (`autotune.algorithms.carry`): each class's cell,
    # which a played NCCL then runs for every all-reduce of that class, with nothing armed (no
    # hook), and NCCL's own choice elsewhere.
    plan = {64 << 10: Choice("nccl.tree.ll"), 4 << 20: Choice("nccl.ring.ll128")}
    plan[1 << 20] = Choice("native")  # the baseline's class: left to NCCL
    assert all(carried(c.algorithm) for c in plan.values()) and not carried("ring")
    (said,) = carry(plan, ranks=2)
    assert "2 row(s)" in said and "64 KiB: nccl.tree.ll" in said, said
    comm = NcclComm(v6(), comm_id=7, ranks=2, nodes=1)
    for nbytes, cell in (
        (40 << 10, (TREE, LL)),  # in the 64 KiB class (32 KiB, 64 KiB]
        (64 << 10, (TREE, LL)),
        (3 << 20, (RING, LL128)),
        (4 << 20, (RING, LL128)),
    ):
        for _ in range(2):  # every later all-reduce, not the first only
            assert changed(comm.coll_info(nbytes)[0]) == {cell: 0.0}, nbytes
    assert changed(comm.coll_info(1 << 20)[0]) == {}  # native: NCCL's own choice
    # For another rank count the rows do not apply: the table is this job's.
    other = NcclComm(v6(), comm_id=8, ranks=4, nodes=1)
    assert changed(other.coll_info(64 << 10)[0]) == {}
    with pytest.raises(ValueError, match="ring runs only through the hook"):
        carry({1 << 20: Choice("ring")}, ranks=2)


@pytest.mark.distributed
def test_a_job_that_locks_nccl_cells_unhooks_and_nccl_runs_them_from_the_table(
    tmp_path: Path,
) -> None:
    # ring/LL128 wins through the hook; it needs no hook, so no check against plain DDP: the job
    # unhooks at once and NCCL's tuner plugin, on every rank, runs each class's cell by itself.
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    got = run_local(unhook_on_fake_nccl, 2, storage, 600, timeout_s=600)
    for rank, r in enumerate(got):
        assert set(r["plan"].values()) == {"nccl.ring.ll128"}, (rank, r["plan"])
        assert r["unhooked_at"] is not None and r["catch"] is None, (rank, r)
        assert r["hooks"] == 0  # DDP's reducer has no comm hook: no Python in the step
        assert r["rows"] == len(r["plan"]) and not r["armed"]
        # Every class the job sent now runs its cell, nothing armed: from the table.
        assert r["ran"] == dict.fromkeys(r["plan"], FAST), (rank, r["ran"])
    assert got[0]["unhooked_at"] == got[1]["unhooked_at"]
    assert "unhooked after iteration" in got[0]["verdict"], got[0]["verdict"]
