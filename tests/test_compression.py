"""Compression on the wire (`Config.compression`, `Choice.wire`): opt-in only, every algorithm
within its wire dtype's rounding, fp16 safe from overflow, old plans read as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compression_jobs import compressed_means, resumed_labels, tuned_labels
from fault_jobs import storage_with_a_ring_plan

from autotune.algorithms import COMPRESSIBLE, WIRES, wire_of
from autotune.comm.launch import run_local
from autotune.config import Config
from autotune.ddp.messages import cast
from autotune.plan import Choice, Entry, Table
from autotune.testing.conformance import hookable_on_gloo
from autotune.tuning.space import choice_of, params_of, search_space, space_tag


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_algorithm_on_a_compressed_wire_matches_the_mean_within_its_rounding(
    world_size: int,
) -> None:
    names = hookable_on_gloo()
    for rank, seen in enumerate(run_local(compressed_means, world_size, names, timeout_s=300)):
        assert sorted(seen) == sorted(f"{n}+{w}" for n in names for w in WIRES), rank
        for label, s in seen.items():
            assert s["over_bound"] <= 1.0, (rank, label, s["over_bound"])
            assert s["the_wires"] and s["finite"] and s["dtype"] == "torch.float32", (rank, label)
            assert s["labels"] == [label], (rank, label, s["labels"])
            # One message in CAST_SAMPLE_EVERY measures its cast: the first and the last here.
            assert len(s["cast_errors"]) == 2, (rank, label, s["cast_errors"])
            u = torch.finfo(WIRES[label.rpartition("+")[2]]).eps / 2
            assert all(0.0 < e <= u for e in s["cast_errors"]), (rank, label, s["cast_errors"])


@pytest.mark.distributed
def test_fp16_does_not_overflow_where_the_mean_fits() -> None:
    # 60000 a rank: the sum at 3 ranks (180000) is past fp16's 65504, the mean is not. The
    # gradients are divided by the world size before the cast, as PyTorch's fp16 hook does.
    for seen in run_local(compressed_means, 3, ["ring", "native"], 0.0, timeout_s=120):
        for label in ("ring+fp16", "native+fp16"):
            assert seen[label]["finite"] and seen[label]["over_bound"] <= 1.0, seen[label]


@pytest.mark.distributed
def test_the_tuner_screens_a_wire_only_where_the_job_names_it(tmp_path: Path) -> None:
    allowed = run_local(tuned_labels, 2, ("bf16",), f"sqlite:///{tmp_path / 'a.db'}")
    assert allowed[0] == allowed[1] and "ring+bf16" in allowed[0], allowed
    assert {"ring", "native"} <= set(allowed[0])
    plain = run_local(tuned_labels, 2, (), f"sqlite:///{tmp_path / 'b.db'}")
    assert all("+" not in label for labels in plain for label in labels), plain


@pytest.mark.distributed
def test_a_stored_compressed_plan_runs_only_where_the_job_allows_its_wire(tmp_path: Path) -> None:
    allowed = storage_with_a_ring_plan(tmp_path / "a.db", 2, wire="bf16")
    resumed = run_local(resumed_labels, 2, ("bf16",), allowed)
    assert all("ring+bf16" in labels for labels in resumed), resumed  # resumed, as stored
    refused = storage_with_a_ring_plan(tmp_path / "b.db", 2, wire="bf16")
    tuned_again = run_local(resumed_labels, 2, (), refused)
    assert all("+" not in label for labels in tuned_again for label in labels), tuned_again


def test_without_opt_in_nothing_is_compressed() -> None:
    assert Config().compression == ()
    for cls in (1 << 12, 1 << 20, 1 << 26):
        assert all(c.wire is None for c in search_space(cls, ["ring", "tree", "native"]))
    # The tuner offers a wire only where the job names it (`Tuner.space`), and only for
    # gradients wider than the wire.
    assert wire_of(Choice("ring", None, "bf16"), torch.bfloat16) is None
    assert wire_of(Choice("ring", None, "fp16"), torch.float32) is torch.float16
    assert wire_of(Choice("ring"), torch.float32) is None and torch.float64 in COMPRESSIBLE


def test_a_compressed_space_is_the_plain_one_on_each_wire_in_a_study_of_its_own() -> None:
    plain = search_space(1 << 20, ["ring", "native"])
    both = search_space(1 << 20, ["ring", "native"], wires=("bf16", "fp16"))
    assert both[: len(plain)] == plain
    assert both[len(plain) :] == [
        Choice(c.algorithm, c.segment_bytes, w) for w in ("bf16", "fp16") for c in plain
    ]
    # A plain space keeps the study name it always had; a compressed one gets its own (Optuna
    # refuses a parameter whose choices change within a study).
    assert space_tag(plain) != space_tag(both)
    for c in both:
        assert choice_of(params_of(c, wired=True), both) == c
    for c in plain:
        assert params_of(c) == {"algorithm": c.algorithm, "segment_bytes": c.segment_bytes or 0}


def test_plans_carry_the_wire_and_old_ones_load() -> None:
    table = Table(
        {1 << 20: Entry(Choice("ring", 1 << 20, "bf16")), 1 << 12: Entry(Choice("tree"))}, 0
    )
    raw = table.to_json()
    assert Table.from_json(json.loads(json.dumps(raw))).classes[1 << 20].choice.wire == "bf16"
    # An uncompressed choice is written as before (no "wire"), so older readers read it.
    classes = raw["classes"]
    assert isinstance(classes, dict)
    assert "wire" not in json.dumps(classes[str(1 << 12)])
    old = {"classes": {str(1 << 12): {"algorithm": "ring", "segment_bytes": None}}}
    assert Table.from_json(old).classes[1 << 12].choice == Choice("ring")
    with pytest.raises(ValueError, match="unknown wire dtype 'fp8'"):
        Table.from_json({"classes": {"4096": {"algorithm": "ring", "wire": "fp8"}}})
    assert str(Choice("ring", 1 << 20, "bf16")) == "ring/1 MiB+bf16"
    assert Choice("ring", None, "fp16").label == "ring+fp16" and Choice("ring").label == "ring"


def test_the_config_takes_wire_dtypes_and_names_a_wrong_one() -> None:
    assert Config(compression=("bf16",)).compression == ("bf16",)
    assert Config(compression="bf16, fp16").compression == ("bf16", "fp16")  # type: ignore[arg-type]
    assert Config.from_env({"AUTOTUNE_COMPRESSION": "fp16"}).compression == ("fp16",)
    with pytest.raises(ValueError, match="AUTOTUNE_COMPRESSION='bf8': unknown wire dtype 'bf8'"):
        Config.from_env({"AUTOTUNE_COMPRESSION": "bf8"})
    with pytest.raises(ValueError, match="names a wire dtype twice"):
        Config(compression=("fp16", "fp16"))


def test_the_cast_error_is_the_relative_distance_the_cast_adds() -> None:
    g = torch.tensor([1.0, 1.0 + 2**-10, 3.0, -4.0])
    sent, error = cast(g, torch.bfloat16, measure=True)
    assert sent.dtype == torch.bfloat16
    expected = float((g - sent.float()).norm() / g.norm())
    assert error is not None and error == pytest.approx(expected) and error > 0
    assert cast(torch.zeros(4), torch.float16, measure=True)[1] == 0.0
    assert cast(g, torch.float16, measure=False)[1] is None
