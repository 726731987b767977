"""The tuner driving NCCL's own algorithm x protocol through the plugin, on 2 gloo ranks whose
"NCCL" asks the plugin through its C ABI as NCCL does (tests/nccl_jobs.py)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
from nccl_jobs import FAST, offered_on_fake_nccl, offered_on_gloo, tune_on_fake_nccl

from autotune.algorithms import BUILTINS, ENTRY_POINT_GROUP, available, get_algorithm_class
from autotune.comm.launch import run_local
from autotune_nccl import ALGORITHMS, PROTOCOLS
from autotune_nccl.algorithms import COMBINATIONS

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
