"""The PromQL behind each panel of a dashboard JSON, with its template variables filled in."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["VARIABLES", "PanelQuery", "panel_queries", "substitute"]

#: What each variable stands for when a dashboard is read outside Grafana: every value, and
#: windows that suit a scrape interval of up to 15 s.
VARIABLES: dict[str, str] = {
    "job": ".*",
    "instance": ".*",
    "rank": ".*",
    "gpu": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "30m",
}

_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def substitute(expr: str, values: Mapping[str, str] = VARIABLES) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced; an unknown variable is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"dashboard variable ${name} has no value (in {expr!r})")
        return values[name]

    return _VAR.sub(one, expr)


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    dashboard: str  # uid
    panel: str  # title
    kind: str  # timeseries, heatmap, table, stat, state-timeline
    unit: str | None
    ref: str
    expr: str  # as written in the dashboard
    legend: str | None
    instant: bool
    grid: tuple[int, int, int, int]  # x, y, w, h


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[PanelQuery]:
    """Every panel target of ``dashboard`` (rows' own panels included), in layout order."""
    panels: list[Mapping[str, Any]] = []
    for p in dashboard.get("panels", []):
        panels.append(p)
        panels += p.get("panels", [])
    for p in panels:
        if p.get("type") == "row":
            continue
        g = p.get("gridPos", {})
        # A heatmap keeps its unit on the y axis, every other panel in its field defaults.
        axis = p.get("options", {}).get("yAxis", {})
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit") or axis.get("unit")
        for t in p.get("targets", []):
            yield PanelQuery(
                dashboard=str(dashboard.get("uid")),
                panel=str(p.get("title")),
                kind=str(p.get("type")),
                unit=unit,
                ref=str(t.get("refId", "A")),
                expr=str(t["expr"]),
                legend=t.get("legendFormat"),
                instant=bool(t.get("instant")),
                grid=(g.get("x", 0), g.get("y", 0), g.get("w", 12), g.get("h", 8)),
            )
