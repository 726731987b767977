"""The few grafana-foundation-sdk shapes the dashboards are made of, in one place.

The SDK is imported here only (lazily, by `autotune dashboards build`): running a job, or
pushing the committed JSON, does not need it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grafana_foundation_sdk.builders import dashboard

__all__ = [
    "ALL",
    "Sdk",
    "sdk",
]

#: The regex a multi-value variable's "All" stands for.
ALL = ".*"


class Sdk:
    """The SDK's modules, imported once, with the builders the dashboards share."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            # The v1 dashboard builder warns that v2 exists; v2 needs Grafana 12 with feature
            # flags, v1 is what Grafana's API and file provisioning take everywhere.
            warnings.simplefilter("ignore", DeprecationWarning)
            from grafana_foundation_sdk.builders import (
                common,
                dashboard,
                heatmap,
                prometheus,
                stat,
                statetimeline,
                table,
                timeseries,
            )
            from grafana_foundation_sdk.cog.encoder import JSONEncoder
            from grafana_foundation_sdk.models import common as common_models
            from grafana_foundation_sdk.models import dashboard as dashboard_models
            from grafana_foundation_sdk.models import prometheus as prometheus_models
        self.common = common
        self.dashboard = dashboard
        self.heatmap = heatmap
        self.prometheus = prometheus
        self.stat = stat
        self.statetimeline = statetimeline
        self.table = table
        self.timeseries = timeseries
        self.encoder = JSONEncoder
        self.models = dashboard_models
        self.common_models = common_models
        self.prometheus_models = prometheus_models
        self.datasource = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
        self._next_id = 0

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- variables ---------------------------------------------------------------------------

    def datasource_variable(self) -> Any:
        return (
            self.dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )

    def label_variable(self, name: str, query: str, label: str | None = None) -> Any:
        """A multi-value variable over a label's values, "All" meaning any value."""
        m = self.models
        return (
            self.dashboard.QueryVariable(name)
            .label(label or name)
            .datasource(self.datasource)
            .query(query)
            .multi(True)
            .include_all(True)
            .all_value(ALL)
            .refresh(m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(m.VariableSort.NATURAL_ASC)
        )

    # -- queries and panels ------------------------------------------------------------------

    def query(self, expr: str, legend: str | None = None, ref: str = "A", **kinds: bool) -> Any:
        q = self.prometheus.Dataquery().expr(expr).ref_id(ref)
        if legend is not None:
            q = q.legend_format(legend)
        if kinds.get("instant"):
            q = q.instant().format(self.prometheus_models.PromQueryFormat.TABLE)
        if kinds.get("heatmap"):
            q = q.format(self.prometheus_models.PromQueryFormat.HEATMAP)
        return q

    def _place(self, panel: Any, title: str, description: str, width: int, height: int) -> Any:
        return (
            panel.id(self.new_id())
            .title(title)
            .description(description)
            .datasource(self.datasource)
            .span(width)
            .height(height)
        )

    def timeseries_panel(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[Any],
        *,
        width: int = 12,
        height: int = 8,
        minimum: float | None = 0,
    ) -> Any:
        c = self.common
        cm = self.common_models
        panel = (
            self._place(self.timeseries.Panel(), title, description, width, height)
            .unit(unit)
            .legend(
                c.VizLegendOptions()
                .show_legend(True)
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
            )
            .tooltip(c.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI))
        )
        if minimum is not None:
            panel = panel.min(minimum)
        for q in queries:
            panel = panel.with_target(q)
        return panel

    def heatmap_panel(
        self, title: str, description: str, unit: str, query: Any, *, width: int = 12
    ) -> Any:
        return (
            self._place(self.heatmap.Panel(), title, description, width, 8)
            .calculate(False)
            .y_axis(self.heatmap.YAxisConfig().unit(unit))
            .with_target(query)
        )

    def table_panel(
        self, title: str, description: str, query: Any, *, width: int = 12, height: int = 8
    ) -> Any:
        return (
            self._place(self.table.Panel(), title, description, width, height)
            .with_target(query)
            .with_transformation(
                self.models.DataTransformerConfig(
                    id_val="organize",
                    options={"excludeByName": {"Time": True, "Value": True, "__name__": True}},
                )
            )
        )

    def stat_panel(
        self,
        title: str,
        description: str,
        unit: str,
        queries: list[Any],
        *,
        width: int = 6,
        height: int = 4,
    ) -> Any:
        panel = self._place(self.stat.Panel(), title, description, width, height).unit(unit)
        for q in queries:
            panel = panel.with_target(q)
        return panel

    def state_panel(
        self,
        title: str,
        description: str,
        query: Any,
        states: dict[str, tuple[str, str]],
        *,
        width: int = 12,
        height: int = 8,
    ) -> Any:
        """A state timeline whose values map to ``states`` (value -> text, color)."""
        mapping = self.models.ValueMap(
            options={
                value: self.models.ValueMappingResult(text=text, color=color, index=i)
                for i, (value, (text, color)) in enumerate(states.items())
            },
        )
        return (
            self._place(self.statetimeline.Panel(), title, description, width, height)
            .mappings([mapping])
            .with_target(query)
        )

    def row(self, title: str) -> Any:
        return self.dashboard.Row(title).id(self.new_id())

    def new_dashboard(self, title: str, uid: str, description: str) -> dashboard.Dashboard:
        self._next_id = 0
        return (
            self.dashboard.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(["autotune"])
            .editable()
            .time("now-30m", "now")
            .refresh("30s")
            .tooltip(self.models.DashboardCursorSync.CROSSHAIR)
        )

    def encode(self, built: Any) -> str:
        return str(self.encoder(sort_keys=True, indent=2).encode(built.build())) + "\n"


_SDK: list[Sdk] = []


def sdk() -> Sdk:
    """The SDK, imported on first use; a clear error if it is not installed."""
    if not _SDK:
        try:
            _SDK.append(Sdk())
        except ImportError as exc:
            raise RuntimeError(
                "building dashboards needs grafana-foundation-sdk: "
                "pip install 'autotune[dashboards]' (it pins grafana-foundation-sdk==0.0.21)"
            ) from exc
    return _SDK[0]
