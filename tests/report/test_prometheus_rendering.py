"""`autotune report`'s reading of a Grafana dashboard (autotune.report): legends as Grafana
formats them and values in each panel's unit. Drawing from a real Prometheus:
tests/dashboards/test_dashboards.py; from sweeps: tests/sweep/test_sweep.py."""

from __future__ import annotations

import math

import pytest

from autotune.report._prometheus import format_value, legend


def test_a_legend_format_takes_each_label_and_leaves_missing_ones_empty() -> None:
    labels = {"__name__": "autotune_busbw", "size_class": "4 MiB", "algorithm": "ring"}
    assert legend("{{algorithm}} at {{ size_class }}", labels) == "ring at 4 MiB"
    assert legend("{{rank}}/{{algorithm}}", labels) == "/ring"


def test_without_a_format_the_legend_is_the_label_set_without_the_name() -> None:
    labels = {"__name__": "x", "b": "2", "a": "1"}
    assert legend(None, labels) == '{a="1", b="2"}'
    assert legend("", {}) == "{}"


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (0.0123, "s", "12.3 ms"),
        (4.5e-7, "s", "450 ns"),
        (3 * 2**20, "bytes", "3 MiB"),
        (512, "bytes", "512 B"),
        (1.25e9, "Bps", "1.25 GB/s"),
        (0.875, "percentunit", "87.5%"),
        (35, "celsius", "35 °C"),
        (0.0, "watt", "0 W"),  # below every scale: the smallest
        (1234.5678, None, "1235"),
        (1234.5678, "an unknown unit", "1235"),
    ],
)
def test_values_are_shown_in_their_panels_unit(value: float, unit: str | None, shown: str) -> None:
    assert format_value(value, unit) == shown


def test_a_missing_value_is_nan_in_any_unit() -> None:
    assert format_value(math.nan, "s") == "NaN"
