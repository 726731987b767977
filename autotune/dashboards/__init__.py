"""Grafana dashboards as code: built with grafana-foundation-sdk into ``dashboards/*.json``,
read back for checks and pictures, and pushed to a Grafana by uid."""

from __future__ import annotations

from autotune.dashboards._files import BUILDERS, build, differences, load, write
from autotune.dashboards._queries import VARIABLES, PanelQuery, panel_queries, substitute

__all__ = [
    "BUILDERS",
    "VARIABLES",
    "PanelQuery",
    "build",
    "differences",
    "load",
    "panel_queries",
    "substitute",
    "write",
]
