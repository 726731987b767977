"""The plugin's tests: a clean tuner for each test, and the profiler's node files (one per
process, for ``autotune daemon``: docs/NCCL_PROFILER.md) in a directory of the session's rather
than the node's /dev/shm."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from autotune_nccl import Tuner


@pytest.fixture(autouse=True, scope="session")
def node_files() -> Iterator[None]:
    """Set before any test starts NCCL's side of the library in this process (ranks inherit it)."""
    saved = os.environ.get("AUTOTUNE_NCCL_SHM_DIR")
    where = tempfile.mkdtemp(prefix="autotune-nccl-shm-")
    os.environ["AUTOTUNE_NCCL_SHM_DIR"] = where
    yield
    if saved is None:
        del os.environ["AUTOTUNE_NCCL_SHM_DIR"]
    else:
        os.environ["AUTOTUNE_NCCL_SHM_DIR"] = saved
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def tuner() -> Iterator[Tuner]:
    """The library's controls with nothing armed, no table and no predictions kept, before and
    after the test (its state is the process's)."""
    t = Tuner()
    for clear in (t.disarm, t.clear_predictions):
        clear()
    t.load_table(None)
    yield t
    for clear in (t.disarm, t.clear_predictions):
        clear()
    t.load_table(None)
