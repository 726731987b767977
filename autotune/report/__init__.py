"""`autotune report`: pictures and tables of what autotune measured (sweeps; Prometheus data)."""

from __future__ import annotations

from autotune.report._prometheus import PrometheusClient, Series, render_dashboard
from autotune.report._sweep import plan_markdown, plot_sweeps

__all__ = ["PrometheusClient", "Series", "plan_markdown", "plot_sweeps", "render_dashboard"]
