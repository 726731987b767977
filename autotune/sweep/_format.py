"""The sweep's text output, laid out like nccl-tests' (one line per size, here per algorithm)."""

from __future__ import annotations

import statistics

from autotune.comm.topology import Topology
from autotune.plan import PLAN_COLUMNS, Choice, Table, aligned, plan_rows, segment_text
from autotune.storage.fingerprint import SWEEP
from autotune.sweep._result import Row, SweepResult
from autotune.util.redact import redact_url
from autotune.util.units import format_bytes

__all__ = ["columns", "footer", "header", "plan_lines", "row_line"]


def _algorithm_width() -> int:
    """The algorithm column's width: the longest registered name, with "tuned:" before it (a
    tuned row's label), and never narrower than nccl-tests' 18 (hierarchical_two_tree, at 21,
    overflowed that)."""
    from autotune.algorithms import available

    return max(18, *(len("tuned:") + len(n) for n in available()))


def columns() -> list[str]:
    """The column names, and their units."""
    w = _algorithm_width()
    return [
        f"#{'size':>11} {'count':>12} {'type':>8} {'algorithm':>{w}} {'segment':>9} "
        f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>{w}} {'(B)':>9} "
        f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
    ]


def header(result: SweepResult, ranks: list[str]) -> list[str]:
    """The lines before the table's columns: what runs where, and how it is timed."""
    o = result.options
    check = f"check {o['check']} iteration(s)" if o["check"] else "no check (-c 0)"
    lines = [
        f"# autotune sweep: all-reduce (sum, in place), {result.world_size} ranks, "
        f"{result.backend}, {result.device}, {result.dtype}"
        + ("" if result.node_of is None else f", {Topology(tuple(result.node_of)).describe()}"),
        f"# {o['iters']} timed iterations after {o['warmup']} warm-up, the algorithms taking "
        f"turns in each; {check}",
        "# time: median over iterations of the slowest rank's; busbw = algbw * 2(n-1)/n",
        *(f"#  {r}" for r in ranks),
        "#",
    ]
    return lines


def _segment(row: Row) -> str:
    return segment_text(Choice(row.chosen or row.algorithm, row.segment_bytes))


def row_line(row: Row) -> str:
    label = f"{row.algorithm}:{row.chosen}" if row.chosen else row.algorithm
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    return (
        f"{row.bytes:>12} {row.count:>12} {row.type:>8} {label:>{_algorithm_width()}} "
        f"{_segment(row).replace(' ', ''):>9} {row.time_us:>10.2f} {row.algbw_gbps:>8.2f} "
        f"{row.busbw_gbps:>8.2f} {wrong:>7}"
    )


def plan_lines(table: Table, key: str | None, storage: str | None) -> list[str]:
    """The tuned plan per size class, and where a job finds it."""
    widths = (10, -10, 9, 12, 6)  # negative: left-aligned

    def line(cells: tuple[str, ...]) -> str:
        return "#  " + aligned(cells, widths)

    where = None if storage is None else redact_url(storage)
    lines = [
        f"# Tuned classes {key}/{SWEEP} in {where}: a job with the same setting takes them as "
        "its screening of these classes (each choice still meets the job's plan on the step)"
    ]
    lines.append(line(PLAN_COLUMNS))
    lines += [line(cells) for _, cells in plan_rows(table.classes)]
    return lines


def footer(result: SweepResult) -> list[str]:
    """The lines after the table: errors, average bus bandwidth, tuned-vs-best, the p2p ceiling."""
    checked = [r for r in [*result.rows, *result.p2p] if r.wrong is not None]
    lines = []
    if checked:
        lines.append(
            f"# Wrong elements       : {result.wrong} {'OK' if result.wrong == 0 else 'FAILED'}"
        )
    for name, busbw in result.avg_busbw_gbps().items():
        lines.append(f"# Avg bus bandwidth    : {busbw:.6g} {name}")
    pairs = result.tuned_vs_best()
    if pairs:
        ratios = [(t.time_us / b.time_us, t, b) for t, b in pairs]
        worst, tuned, best = max(ratios, key=lambda x: x[0])
        lines.append(
            f"# Tuned vs best fixed  : median {statistics.median(r for r, _, _ in ratios):.3f}x, "
            f"worst {worst:.3f}x at {format_bytes(tuned.bytes)} ({tuned.chosen} against "
            f"{best.algorithm}): time ratios against the fastest candidate at each size"
        )
        same = [
            r for r, t, b in ratios if (t.chosen, t.segment_bytes) == (b.algorithm, b.segment_bytes)
        ]
        if same:
            # The plan ran exactly the best fixed configuration: any ratio but 1 is noise.
            lines.append(
                f"# Noise floor          : {min(same):.3f}x to {max(same):.3f}x where the plan "
                f"ran the best fixed configuration itself ({len(same)} sizes)"
            )
    if result.p2p:
        lines += _p2p_lines(result)
    if result.plan is not None:
        lines += plan_lines(result.plan, result.plan_key, result.storage)
    return lines


def _p2p_lines(result: SweepResult) -> list[str]:
    names = result.algorithms()
    eff = result.p2p_efficiency()
    width = max(8, *(len(n) + 1 for n in names))
    lines = [
        "#",
        "# Point-to-point ceiling: every rank sends to the next and receives from the previous at "
        "once (a ring step); each algorithm's busbw as a fraction of it:",
        f"#{'size':>11} {'time':>10} {'p2p bw':>8} " + "".join(f"{n:>{width}}" for n in names),
        f"#{'(B)':>11} {'(us)':>10} {'(GB/s)':>8}",
    ]
    for r in result.p2p:
        cells = "".join(
            f"{eff[n][r.bytes]:>{width}.2f}" if r.bytes in eff.get(n, {}) else f"{'-':>{width}}"
            for n in names
        )
        lines.append(f"#{r.bytes:>11} {r.time_us:>10.2f} {r.busbw_gbps:>8.3f} {cells}")
    return lines
