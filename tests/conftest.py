"""Shared fixtures: a cache directory of the suite's own, a registry each test may change, and the
check that a test leaves nothing running."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.algorithms import _registry

# The functions spawned ranks run (tests/jobs/) and the real servers' fixtures (tests/support/),
# importable by name from every test folder and from the ranks, which inherit this path.
for _helpers in ("jobs", "support"):
    sys.path.insert(0, str(Path(__file__).parent / _helpers))

# Every test must leave no thread, child process or process group behind (see the plugin).
pytest_plugins = ["autotune.testing.leaks", "pytester"]


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the user's cache (the default tuning storage lives there) out of the tests' reach.

    Set before the first test, so before the launcher's forkserver starts: ranks inherit the
    forkserver's environment, not the test process's later changes.
    """
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


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


@pytest.fixture
def stale_after_s(monkeypatch: pytest.MonkeyPatch) -> float:
    """Heartbeats every second and a 2 s grace, for stores opened in the test; returns how long
    to wait for a trial to go stale (the grace, plus SQLite's 1 s clock resolution, plus margin)."""
    from autotune.storage import store

    monkeypatch.setattr(store, "HEARTBEAT_S", 1)
    monkeypatch.setattr(store, "STALE_AFTER_S", 2)
    return 3.5
