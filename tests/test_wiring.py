"""`autotune.wiring`: a state's parts, built on every rank, and closed again when one fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddp_jobs import refused_leaves_nothing

from autotune.comm.launch import run_local


@pytest.mark.distributed
def test_parts_built_before_a_failing_one_are_closed(tmp_path: Path) -> None:
    # Refused after the engine and its two threads are up (an algorithm that cannot run here),
    # and after the engine, the guard and the tuner's storage (a database nobody can open).
    refused = {"algorithm": "nccl.ring.ll"}
    assert run_local(refused_leaves_nothing, 2, refused) == [[], []]
    unopenable = {"storage": "postgres://127.0.0.1:1/autotune"}
    assert run_local(refused_leaves_nothing, 2, unopenable) == [[], []]
