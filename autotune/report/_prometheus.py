"""Pictures of the dashboards drawn from a Prometheus, with matplotlib, where no Grafana runs.

Each dashboard's own JSON drives the picture: its panels, their layout, their PromQL (variables
set to "All") and their units, so the picture shows what the dashboard would.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.dashboards import VARIABLES, PanelQuery, panel_queries, substitute
from autotune.report._sweep import _figure
from autotune.util.redact import redact

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["PrometheusClient", "Series", "render_dashboard"]


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix time, value)


class PrometheusClient:
    """The two calls of Prometheus's HTTP API a picture needs; errors say which query failed."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(
                f"{self.url}{path}?{query}", timeout=self.timeout_s
            ) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # Prometheus explains a bad query in the body
            body = json.loads(exc.read() or b"{}")
        except OSError as exc:
            raise RuntimeError(redact(f"cannot reach Prometheus at {self.url}: {exc}")) from None
        if body.get("status") != "success":
            raise ValueError(f"{params.get('query')!r}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        return [
            Series(r["metric"], [(float(r["value"][0]), float(r["value"][1]))])
            for r in data["result"]
        ]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        return [
            Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]
        ]

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self._get(f"/api/v1/label/{label}/values", {"match[]": match})
        return values


_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str | None, labels: Mapping[str, str]) -> str:
    """Grafana's legend format: ``{{label}}`` replaced by the series' label value."""
    if not fmt:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{{{inner}}}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


_SCALES: dict[str, list[tuple[float, str]]] = {
    "s": [(1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")],
    "Bps": [(1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1, "B/s")],
    "bytes": [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")],
    "hertz": [(1e9, "GHz"), (1e6, "MHz"), (1e3, "kHz"), (1, "Hz")],
    "watt": [(1e3, "kW"), (1, "W")],
    "joule": [(1e6, "MJ"), (1e3, "kJ"), (1, "J")],
    "celsius": [(1, "°C")],
}


def format_value(value: float, unit: str | None) -> str:
    """``value`` in ``unit`` (a Grafana unit id) as Grafana would roughly print it."""
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    for scale, name in _SCALES.get(unit or "", []):
        if abs(value) >= scale or scale == _SCALES[unit or ""][-1][0]:
            return f"{value / scale:.3g} {name}"
    return f"{value:.4g}"


def render_dashboard(
    client: PrometheusClient,
    dashboard: Mapping[str, Any],
    path: str,
    *,
    minutes: float = 30.0,
    end: float | None = None,
    values: Mapping[str, str] = VARIABLES,
) -> dict[str, int]:
    """Draw ``dashboard`` over the last ``minutes`` into ``path``; return series per panel."""
    end = end or time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    fills = {**values, "__range": f"{max(1, round(minutes))}m"}
    panels: dict[str, list[PanelQuery]] = {}
    for q in panel_queries(dashboard):
        panels.setdefault(q.panel, []).append(q)
    rows = [p for p in dashboard.get("panels", []) if p.get("type") == "row"]
    height = max(
        [q.grid[1] + q.grid[3] for qs in panels.values() for q in qs]
        + [int(r["gridPos"]["y"]) + 1 for r in rows]
    )
    unit_in = 0.33  # inches per grid row
    fig = _figure(18, height * unit_in + 0.8)
    fig.set_layout_engine(None)
    total_h = height * unit_in + 0.8
    fig.suptitle(
        f"{dashboard.get('title')}: the last {minutes:g} minutes, every job, instance, rank "
        "and GPU",
        fontsize=11,
        y=1 - 0.15 / total_h,
    )

    def box(x: int, y: int, w: int, h: int) -> tuple[float, float, float, float]:
        left = x / 24 + 0.035  # room for the y tick labels
        width = w / 24 - 0.045
        top_in = 0.6 + y * unit_in + 0.3  # room for the panel's title
        bottom_in = 0.6 + (y + h) * unit_in - 0.35  # and for the x label
        return (left, 1 - bottom_in / total_h, width, (bottom_in - top_in) / total_h)

    for r in rows:
        y = int(r["gridPos"]["y"])
        fig.text(
            0.005,
            1 - (0.6 + (y + 0.7) * unit_in) / total_h,
            str(r.get("title")),
            fontsize=10,
            weight="bold",
        )
    counts = {}
    for title, queries in panels.items():
        first = queries[0]
        ax = fig.add_axes(box(*first.grid))
        ax.set_title(title, fontsize=8.5, loc="left")
        ax.tick_params(labelsize=7)
        counts[title] = _draw(ax, client, queries, start, end, step, fills, dashboard)
    fig.savefig(path, dpi=90)
    return counts


def _draw(
    ax: Axes,
    client: PrometheusClient,
    queries: Sequence[PanelQuery],
    start: float,
    end: float,
    step: float,
    fills: Mapping[str, str],
    dashboard: Mapping[str, Any],
) -> int:
    kind, unit = queries[0].kind, queries[0].unit
    if kind in ("table", "stat"):
        series = [(q, s) for q in queries for s in client.query(substitute(q.expr, fills), at=end)]
        ax.axis("off")
        if not series:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="gray")
            return 0
        if kind == "stat":
            text = "\n".join(
                f"{format_value(s.points[-1][1], unit)}" + (f"  {legend(q.legend, s.labels)}")
                for q, s in series[:6]
            )
            ax.text(
                0.5,
                0.45,
                text,
                ha="center",
                va="center",
                fontsize=13 if len(series) == 1 else 9,
                weight="bold",
                color="#1f60c4",
            )
            return len(series)
        columns = sorted({k for _, s in series for k in s.labels if k != "__name__"})
        cells = [[s.labels.get(c, "") for c in columns] for _, s in series]
        cells.sort(key=lambda row: [(0, int(v), "") if v.isdigit() else (1, 0, v) for v in row])
        table = ax.table(cellText=cells[:14], colLabels=columns, loc="upper center")
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        return len(series)
    per_query = [
        (q, client.query_range(substitute(q.expr, fills), start, end, step)) for q in queries
    ]
    n = sum(len(s) for _, s in per_query)
    if n == 0:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="gray", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return 0
    if kind == "heatmap":
        _heatmap(ax, per_query[0][1], unit)
        return n
    if kind == "state-timeline":
        _states(ax, per_query[0][0], per_query[0][1], dashboard, end)
        return n
    from matplotlib.ticker import FuncFormatter

    for q, ranged in per_query:
        for line in sorted(ranged, key=lambda s: legend(q.legend, s.labels))[:12]:
            ts = [(t - end) / 60 for t, _ in line.points]
            ax.plot(ts, [v for _, v in line.points], lw=1.2, label=legend(q.legend, line.labels))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    ax.set_xlabel("minutes before now", fontsize=7)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", ncol=2 if n > 6 else 1, framealpha=0.6)
    return n


def _heatmap(ax: Axes, series: Sequence[Series], unit: str | None) -> None:
    """Cumulative ``le`` buckets over time, drawn as counts per bucket."""
    import numpy as np

    by_le = sorted(
        (float(s.labels.get("le", "inf")), s) for s in series if s.labels.get("le") is not None
    )
    times = sorted({t for _, s in by_le for t, _ in s.points})
    index = {t: i for i, t in enumerate(times)}
    cum = np.zeros((len(by_le), len(times)))
    for row, (_, s) in enumerate(by_le):
        for t, v in s.points:
            cum[row, index[t]] = v
    counts = np.diff(cum, axis=0, prepend=0)
    keep = counts.sum(axis=1) > 0
    counts, les = counts[keep], [le for (le, _), k in zip(by_le, keep, strict=True) if k]
    if not les:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="gray")
        return
    ax.imshow(
        counts,
        aspect="auto",
        origin="lower",
        cmap="Oranges",
        interpolation="nearest",
        extent=((times[0] - times[-1]) / 60, 0, 0, len(les)),
    )
    ax.set_yticks([i + 0.5 for i in range(len(les))])
    ax.set_yticklabels(
        ["+Inf" if math.isinf(le) else format_value(le, unit) for le in les], fontsize=6
    )
    ax.set_xlabel("minutes before now", fontsize=7)


def _states(
    ax: Axes,
    query: PanelQuery,
    series: Sequence[Series],
    dashboard: Mapping[str, Any],
    end: float,
) -> None:
    mapping: dict[str, tuple[str, str]] = {}
    for p in dashboard.get("panels", []):
        if p.get("title") == query.panel:
            for m in p.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
                for value, result in m.get("options", {}).items():
                    mapping[value] = (result.get("text", value), result.get("color", "gray"))
    ordered = sorted(series, key=lambda s: legend(query.legend, s.labels))[:12]
    for row, s in enumerate(ordered):
        for (t0, v), (t1, _) in zip(s.points, [*s.points[1:], s.points[-1]], strict=True):
            color = mapping.get(f"{v:g}", ("", "gray"))[1]
            ax.barh(
                row,
                max((t1 - t0) / 60, 1e-3),
                left=(t0 - end) / 60,
                color=color,
                height=0.8,
            )
    ax.set_yticks(range(len(ordered)))
    ax.set_yticklabels([legend(query.legend, s.labels) for s in ordered], fontsize=6)
    handles = {text: color for text, color in mapping.values()}
    from matplotlib.patches import Patch

    ax.legend(
        [Patch(color=c) for c in handles.values()], list(handles), fontsize=6, loc="upper left"
    )
    ax.set_xlabel("minutes before now", fontsize=7)
