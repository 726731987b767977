"""Size classes, the default "auto" rule, and the plan table."""

from __future__ import annotations

import pytest

from autotune.plan import Choice, Gain, Plan, Table, size_class


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


def test_a_tables_gain_reads_back_and_bad_gains_are_refused() -> None:
    gain = Gain(0.9, 0.85, float("inf"), 12)
    table = Table({}, 0, None, gain)
    assert Table.from_json(table.to_json()) == table
    with pytest.raises(ValueError, match="gain: pairs"):
        Table.from_json({"classes": {}, "gain": {"ratio": 0.9, "pairs": -1}})
    with pytest.raises(ValueError, match="gain: ratio"):
        Table.from_json({"classes": {}, "gain": {"ratio": "fast", "pairs": 3}})
