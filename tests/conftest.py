"""Shared fixtures: a registry that each test may change and gets back untouched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autotune.algorithms import _registry


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Snapshot the algorithm registry and plugin-loading state; restore them after the test."""
    saved = (
        dict(_registry.ALGORITHMS),
        dict(_registry.PLUGIN_SOURCES),
        list(_registry._loaded),
        dict(_registry._failed),
    )
    yield
    algorithms, sources, loaded, failed = saved
    _registry.ALGORITHMS.clear()
    _registry.ALGORITHMS.update(algorithms)
    _registry.PLUGIN_SOURCES.clear()
    _registry.PLUGIN_SOURCES.update(sources)
    _registry._loaded[:] = loaded
    _registry._failed.clear()
    _registry._failed.update(failed)
