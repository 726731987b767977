"""Size classes, the default "auto" rule, and the plan table."""

from __future__ import annotations

import json

import pytest

from autotune.plan import Arm, Choice, Gain, NearMiss, Plan, Table, size_class


@pytest.mark.parametrize(
    ("nbytes", "cls"),
    [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1 << 20, 1 << 20), ((1 << 20) + 1, 2 << 20)],
)
def test_size_class_holds_half_open_ranges(nbytes: int, cls: int) -> None:
    assert size_class(nbytes) == cls
    if nbytes > 1:
        assert cls // 2 < nbytes <= cls


def test_size_class_rejects_negative() -> None:
    with pytest.raises(ValueError):
        size_class(-1)


def test_plan_table_lists_the_classes_seen() -> None:
    plan = Plan(Choice("ring", 1 << 20))
    assert plan.table() == {}
    plan.choice(3000)
    plan.choice(100)
    plan.set(4096, Choice("tree"))
    assert plan.table() == {128: Choice("ring", 1 << 20), 4096: Choice("tree")}
    assert plan.choice(4000) == Choice("tree")
    with pytest.raises(ValueError, match="powers of two"):
        plan.set(3000, Choice("tree"))


def test_rule_gets_the_class_so_a_class_has_one_choice() -> None:
    plan = Plan(lambda cls: Choice("tree" if cls <= 1 << 20 else "native"))
    # 1 MiB + 1 byte is in the 2 MiB class: native, like every other message in that class.
    assert plan.choice((1 << 20) + 1) == Choice("native")
    assert plan.choice(2 << 20) == Choice("native")


def test_replace_runs_exactly_the_given_choices() -> None:
    plan = Plan(Choice("native"))
    plan.set(4096, Choice("tree"))
    plan.replace({1 << 20: Choice("ring")})
    assert plan.choice(4096) == Choice("native") and plan.choice(1 << 20) == Choice("ring")
    # Every choice it can make, seen or not: the default and the explicit ones.
    assert plan.choices() == [Choice("native"), Choice("ring")]


def test_a_plan_with_a_rule_cannot_say_every_choice_it_makes() -> None:
    plan = Plan(lambda cls: Choice("tree" if cls <= 1 << 20 else "native"))
    assert plan.choices() is None
    plan.set_default(Choice("native"))
    assert plan.choices() == [Choice("native")]


def test_a_tables_gain_reads_back_and_bad_gains_are_refused() -> None:
    gain = Gain(0.9, 0.85, float("inf"), 12)
    table = Table({}, 0, None, gain)
    assert Table.from_json(table.to_json()) == table
    with pytest.raises(ValueError, match="gain: pairs"):
        Table.from_json({"classes": {}, "gain": {"ratio": 0.9, "pairs": -1}})
    with pytest.raises(ValueError, match="gain: ratio"):
        Table.from_json({"classes": {}, "gain": {"ratio": "fast", "pairs": 3}})


def test_a_tables_lead_reads_back_and_a_bad_lead_is_refused() -> None:
    lead = NearMiss(Arm(((4 << 20, Choice("tree", 1 << 18)),), 16 << 20), Gain(0.95, 0.9, 1.02, 24))
    table = Table({}, 0, None, None, lead)
    back = Table.from_json(json.loads(json.dumps(table.to_json())))
    assert back == table and back.lead is not None
    assert back.lead.arm.choice(4 << 20) == Choice("tree", 1 << 18)
    assert back.lead.arm.fusion_bytes == 16 << 20 and back.lead.gain.pairs == 24
    good = table.to_json()["lead"]
    assert isinstance(good, dict)
    for bad, match in [
        ({**good, "choices": {"3": {"algorithm": "tree"}}}, "lead, class '3': size classes"),
        ({**good, "choices": {"4096": {"algorithm": "nope"}}}, "unknown algorithm 'nope'"),
        ({**good, "choices": {"4096": {"algorithm": "ring", "segment_bytes": 0}}}, "at least 4096"),
        ({**good, "choices": {"4096": {"algorithm": "ring", "segment_bytes": 3}}}, "at least 4096"),
        ({**good, "fusion_bytes": None}, "lead: fusion_bytes must be an int"),
        ({**good, "fusion_bytes": 5}, "lead: fusion_bytes: must be 0"),
        ({**good, "gain": None}, "gain: expected an object"),
        ("tree", "lead: expected an object"),
    ]:
        with pytest.raises(ValueError, match=match):
            Table.from_json({"classes": {}, "lead": bad})
