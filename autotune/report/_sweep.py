"""Pictures of sweeps: bus bandwidth and latency against message size, per algorithm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.algorithms import ALGORITHMS, BUILTINS
from autotune.comm.topology import Topology
from autotune.plan import PLAN_COLUMNS, plan_rows
from autotune.sweep import P2P, SweepResult
from autotune.util.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autotune.model import Fit

__all__ = ["plan_markdown", "plot_sweeps"]

_BUILTIN_NAMES = {cls.name for cls in BUILTINS}


def _figure(width: float, height: float) -> Figure:
    """A figure drawn off screen (no pyplot, no display needed)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError(
            "autotune report draws with matplotlib: pip install 'autotune[report]'"
        ) from exc
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _size_axis(ax: Axes) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda x, _: format_bytes(int(x)).replace("iB", "").replace(" ", ""))
    )
    ax.set_xlabel("message size")
    ax.grid(True, which="major", alpha=0.3)


def plot_sweeps(
    results: Sequence[SweepResult], path: str, fits: Sequence[Fit | None] | None = None
) -> None:
    """Draw each result as a column: busbw and latency against size; the plan as a table.

    ``fits`` (one per result, or None): the cost model fitted to it (`autotune.model.fit`),
    whose predicted times are drawn dotted over the measured ones, in the algorithm's color."""
    names: list[str] = []
    for result in results:
        names += [a for a in result.algorithms() if a not in names and a != "tuned"]
    palette = [
        "#1f77b4",
        "#ff7f0e",
        "#2ca02c",
        "#d62728",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
        "#bcbd22",
        "#17becf",
    ]
    color = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    plan_rows = max((len(r.plan.classes) for r in results if r.plan is not None), default=0)
    heights = [3.6, 3.6] + ([0.22 * (plan_rows + 3)] if plan_rows else [])
    fig = _figure(5.5 * len(results), sum(heights))
    axes = fig.subplots(
        len(heights), len(results), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    with_plan = bool(plan_rows)
    for col, result in enumerate(results):
        bw, lat = axes[0][col], axes[1][col]
        for name in result.algorithms():
            pts = [r for r in result.rows if r.algorithm == name and r.count > 0]
            if name == "tuned":
                # The plan's choice at each size: a ring around the point, in its algorithm's color.
                for r in pts:
                    c = color.get(r.chosen or "", "black")
                    for ax, y in ((bw, r.busbw_gbps), (lat, r.time_us)):
                        ax.plot([r.bytes], [y], "o", mfc="none", mec=c, ms=10, mew=1.6, zorder=5)
                bw.plot([], [], "o", mfc="none", mec="black", ms=10, label="tuned choice")
                continue
            xs = [r.bytes for r in pts]
            style = "--" if ALGORITHMS.get(name) is None else "-"
            bw.plot(
                xs, [r.busbw_gbps for r in pts], style, marker=".", color=color[name], label=name
            )
            lat.plot(xs, [r.time_us for r in pts], style, marker=".", color=color[name], label=name)
        fitted = fits[col] if fits is not None else None
        if fitted is not None:
            _predictions(lat, fitted, color)
        if result.p2p:
            pts = [r for r in result.p2p if r.count > 0]
            bw.plot(
                [r.bytes for r in pts],
                [r.busbw_gbps for r in pts],
                ":",
                color="black",
                lw=2,
                label=f"{P2P} ceiling",
            )
        for ax in (bw, lat):
            _size_axis(ax)
            ax.set_yscale("log")
        where = f"{result.world_size} ranks, {result.backend}, {result.device}, {result.dtype}"
        if result.node_of is not None and max(result.node_of) > 0:
            where = f"{Topology(tuple(result.node_of)).describe()}, {where}"
        bw.set_title(f"bus bandwidth: {where}", fontsize=9)
        bw.set_ylabel("busbw (GB/s)")
        model = ""
        if fitted is not None:
            model = f"; dotted: model, median error {fitted.median_error():.0%}"
        lat.set_title(f"latency (median of the slowest rank){model}", fontsize=9)
        lat.set_ylabel("time (us)")
        bw.legend(fontsize=7, loc="upper left")
        if with_plan:
            _plan_table(axes[2][col], result)
    fig.savefig(path, dpi=110)


def _predictions(ax: Axes, fitted: Fit, color: dict[str, str]) -> None:
    """The fitted model's time for each sample's algorithm and size, dotted."""
    by_name: dict[str, list[tuple[int, float]]] = {}
    for sample, t in zip(fitted.samples, fitted.predicted, strict=True):
        by_name.setdefault(sample.algorithm, []).append((sample.nbytes, t * 1e6))
    for name, points in by_name.items():
        points.sort()
        ax.plot(*zip(*points, strict=True), ":", lw=1.4, color=color.get(name, "black"))


def _plan_table(ax: Axes, result: SweepResult) -> None:
    ax.axis("off")
    if result.plan is None:
        ax.set_title("no tuned plan (run the sweep with --tune)", fontsize=9)
        return
    cells = [list(row[:4]) for _, row in plan_rows(result.plan.classes)]
    table = ax.table(
        cellText=cells,
        colLabels=list(PLAN_COLUMNS[:4]),
        loc="upper center",
        cellLoc="center",
    )
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    ax.set_title(f"tuned plan (stored as {result.plan_key})", fontsize=9)


def plan_markdown(result: SweepResult) -> str:
    """The tuned plan as a markdown table, with the tuned-vs-best ratio at each size."""
    if result.plan is None:
        return ""
    ratio = {t.bytes: (t.time_us / b.time_us, b.algorithm) for t, b in result.tuned_vs_best()}
    lines = [
        f"Tuned plan, {result.world_size} ranks ({result.backend}, {result.dtype}), key "
        f"{result.plan_key}:",
        "",
        "| " + " | ".join(PLAN_COLUMNS) + " | tuned / best fixed |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for cls, cells in plan_rows(result.plan.classes):
        r = ratio.get(cls)
        vs = "-" if r is None else f"{r[0]:.2f}x ({r[1]})"
        lines.append("| " + " | ".join(cells) + f" | {vs} |")
    return "\n".join(lines)
