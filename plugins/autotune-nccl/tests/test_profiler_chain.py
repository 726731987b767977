"""A chained profiler (AUTOTUNE_NCCL_PROFILER_CHAIN): autotune's library loads a second NCCL
profiler plugin (tests/played_second_profiler.c, built here) and forwards NCCL's calls to it with
its own contexts and handles, while its own records stay exact. Each case runs in a process of
its own (tests/chain_job.py): the library reads the variable at its first communicator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune_nccl.played.profiler import (
    COLL,
    KERNEL_CH,
    KERNEL_PHASE,
    PROXY_OP,
    SYMMETRIC_PHASES,
)

HERE = Path(__file__).resolve().parent
START, STOP, RECORD, FINALIZE = 1, 2, 3, 4
OURS = COLL | KERNEL_CH
#: The played all-reduce's phases (SYMMETRIC_PHASES): each phase's longest channel.
PHASE_NS = [2_000, 41_000, 11_000]


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The played second profiler, built twice: exporting v7, v6 and v5, and v5 alone."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler (cc or gcc) on PATH")
        pytest.skip("needs a C compiler (apt-get install -y gcc)")
    where = tmp_path_factory.mktemp("second")
    built = {}
    for name, flags in (("full", []), ("v5", ["-DONLY_V5"])):
        out = where / f"second_{name}.so"
        src = str(HERE / "played_second_profiler.c")
        subprocess.run(
            [cc, "-O2", "-Wall", "-shared", "-fPIC", "-pthread", *flags, "-o", str(out), src],
            check=True,
        )
        built[name] = str(out)
    return built


def run(version: str, comms: int, chain: str, second: str | None = None, **env: str) -> Any:
    """chain_job.py in a process of its own; its JSON, and its stderr as "stderr"."""
    environ = {**os.environ, "AUTOTUNE_NCCL_SHM": "0", "AUTOTUNE_NCCL_PROFILER_CHAIN": chain}
    environ.update(env)
    args = [sys.executable, str(HERE / "chain_job.py"), version, str(comms)]
    out = subprocess.run(
        [*args, *([second] if second else [])],
        env=environ, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    got = json.loads(out.stdout)
    got["stderr"] = [line for line in out.stderr.splitlines() if line.strip()]
    return got


def starts(log: list[dict[str, Any]], type_: int) -> list[dict[str, Any]]:
    return [e for e in log if e["call"] == START and e["type"] == type_]


def test_every_event_reaches_the_chained_profiler_with_its_own_handles(
    second: dict[str, str],
) -> None:
    got = run("v7", 1, second["full"], second["full"])
    # NCCL is asked for both plugins' events: the second one's proxy ops too.
    assert got["masks"] == [OURS | KERNEL_PHASE | PROXY_OP]
    [r] = got["records"]  # autotune's record is exact, the phases its own
    assert (r["kernel_ns"], r["channels_seen"], r["symmetric"]) == (51_000, 2, True)
    assert (r["phase_ns"], r["phases_seen"]) == (PHASE_NS, 6)
    log = got["log"]
    [init] = [e for e in log if e["call"] == 0]
    assert all(e["ctx"] == init["ctx"] for e in log if e["call"] in (START, FINALIZE))
    [coll] = starts(log, COLL)
    assert coll["parent"] is None
    proxies, channels = starts(log, PROXY_OP), starts(log, KERNEL_CH)
    # Children name the second profiler's own parent, never autotune's handle.
    assert [e["parent"] for e in proxies + channels] == [coll["handle"]] * 4
    assert [e["timer"] for e in channels] == [1_000, 3_000]
    phases = starts(log, KERNEL_PHASE)
    assert [e["parent"] for e in phases] == [channels[0]["handle"]] * 3 + [
        channels[1]["handle"]
    ] * 3
    records = [(e["state"], e["timer"]) for e in log if e["call"] == RECORD]
    assert sorted(records) == sorted(
        [(22, 41_000), (22, 52_000)]
        + [(31, stop) for ch in (0, 1) for _, stop in SYMMETRIC_PHASES[ch]]
    )
    handles = {e["handle"] for e in log if e["call"] == START}
    stopped = [e["handle"] for e in log if e["call"] == STOP]
    assert sorted(stopped) == sorted(handles)  # each event stopped once, by its own handle
    assert [e["call"] for e in log].count(FINALIZE) == 1
    s = got["stats"]
    assert s["chained"] == len(log) - 1  # every call but its init, counted
    assert (s["chain_version"], s["chain_failures"], s["orphans"], s["ignored"]) == (7, 0, 0, 0)
    assert got["stderr"] == []


def test_a_chained_v5_profiler_under_nccl_2_31_gets_what_v5_knows(second: dict[str, str]) -> None:
    got = run("v7", 1, second["v5"], second["v5"])
    assert got["stats"]["chain_version"] == 5
    log = got["log"]
    assert starts(log, KERNEL_PHASE) == []  # v5 has no phases: not passed on
    assert all(e["state"] != 31 for e in log if e["call"] == RECORD)
    assert len(starts(log, KERNEL_CH)) == 2 and len(starts(log, COLL)) == 1
    [r] = got["records"]
    assert (r["kernel_ns"], r["phase_ns"], r["phases_seen"]) == (51_000, PHASE_NS, 6)


@pytest.mark.parametrize("version", ["v6", "v5"])
def test_the_same_version_is_chained_as_it_is(second: dict[str, str], version: str) -> None:
    got = run(version, 1, second["full"], second["full"])
    assert got["stats"]["chain_version"] == int(version[1])
    assert got["masks"] == [OURS | PROXY_OP]
    [r] = got["records"]
    assert (r["kernel_ns"], r["symmetric"]) == (51_000, None)
    assert len(starts(got["log"], KERNEL_CH)) == 2


def test_a_chained_init_that_fails_is_logged_once_and_autotune_goes_on(
    second: dict[str, str],
) -> None:
    got = run("v7", 2, second["full"], second["full"], SECOND_FAIL_INIT="1")
    assert got["masks"] == [OURS | KERNEL_PHASE] * 2  # only autotune's own events
    assert [r["kernel_ns"] for r in got["records"]] == [51_000, 51_000]
    assert got["log"] == []
    assert got["stats"]["chain_failures"] == 2 and got["stats"]["chained"] == 0
    [line] = got["stderr"]
    assert "chained profiler: its init returned 3" in line and "goes on" in line


def test_a_chained_library_that_cannot_load_is_named_once(tmp_path: Path) -> None:
    missing = str(tmp_path / "inspector.so")
    got = run("v7", 2, missing)
    assert [r["kernel_ns"] for r in got["records"]] == [51_000, 51_000]
    assert (got["stats"]["chain_version"], got["stats"]["chain_failures"]) == (0, 1)
    [line] = got["stderr"]
    assert f"AUTOTUNE_NCCL_PROFILER_CHAIN={missing} cannot be loaded" in line
