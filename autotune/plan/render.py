"""A tuned table's cells as every plan table shows them (the CLI, the sweep, the report, the
summary lines, ``print(state.table())``): one row per size class.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.plan.records import Entry
from autotune.plan.runtime import Choice

__all__ = ["PLAN_COLUMNS", "aligned", "plan_rows", "segment_text"]


def segment_text(choice: Choice) -> str:
    """A choice's segment as every table shows it: "-" where the algorithm has none (or is not
    registered here), "default" for the algorithm's own, else the size ("256 KiB")."""
    from autotune.algorithms import ALGORITHMS
    from autotune.util.units import format_bytes

    algo = ALGORITHMS.get(choice.algorithm)
    if algo is None or not algo.segmented:
        return "-"
    return "default" if choice.segment_bytes is None else format_bytes(choice.segment_bytes)


#: The columns of `plan_rows`.
PLAN_COLUMNS = ("size class", "algorithm", "segment", "median (us)", "trials")


def plan_rows(classes: Mapping[int, Entry]) -> list[tuple[int, tuple[str, str, str, str, str]]]:
    """A tuned table's cells (its ``classes``), one row per size class (smallest first), as every
    plan table shows them (`PLAN_COLUMNS`); each renderer lays them out (text, markdown, a
    figure)."""
    from autotune.util.units import format_bytes

    return [
        (
            cls,
            (
                format_bytes(cls),
                e.choice.label,
                segment_text(e.choice),
                "-" if e.best_s is None else f"{e.best_s * 1e6:.1f}",
                str(e.trials),
            ),
        )
        for cls, e in sorted(classes.items())
    ]


def aligned(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    """One text row of a plan table: each cell right-aligned in its width (left-aligned where
    the width is negative), one space between."""
    return " ".join(
        f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)
    )
