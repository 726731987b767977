"""``python -m autotune_nccl.selfcheck``: each tuner and profiler symbol as its NCCL calls it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_profiler_chain import second  # noqa: F401  (the fixture: the played second profiler)


def selfcheck(**env: str) -> tuple[int, list[str]]:
    environ = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_NCCL_PROFILER_CHAIN"}
    out = subprocess.run(
        [sys.executable, "-m", "autotune_nccl.selfcheck"],
        env={**environ, **env}, capture_output=True, text=True,
    )  # fmt: skip
    return out.returncode, out.stdout.splitlines()


def test_every_symbol_does_what_its_nccl_expects() -> None:
    rc, lines = selfcheck()
    assert rc == 0, lines
    symbols = [line.split()[1] for line in lines]
    assert symbols == [f"ncclTunerPlugin_v{v}" for v in range(2, 8)] + [
        f"ncclProfiler_v{v}" for v in range(3, 8)
    ] + ["chain"]  # fmt: skip
    assert all(line.startswith("ok ") for line in lines)
    assert "(host clock)" in lines[6] and "kernel 51.0 us (gpu clock)" in lines[-3]
    assert lines[-2].endswith("kernel 51.0 us (gpu clock), symmetric, 3 phases")
    assert lines[-1].endswith("none configured (AUTOTUNE_NCCL_PROFILER_CHAIN unset)")


def test_the_chain_line_says_whether_the_chained_profiler_got_the_calls(
    second: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    rc, lines = selfcheck(AUTOTUNE_NCCL_PROFILER_CHAIN=second["full"])
    assert rc == 0, lines
    # One all-reduce on two channels: the collective's start and stop, per channel a proxy op's
    # start and stop and the kernel channel's start, stop state and stop, and the finalize.
    assert lines[-1].startswith("ok   chain") and "at its v7: 13 calls forwarded" in lines[-1]
    rc, lines = selfcheck(AUTOTUNE_NCCL_PROFILER_CHAIN=str(tmp_path / "missing.so"))
    assert rc == 1 and lines[-1].startswith("FAIL chain")
    assert "cannot be loaded" in lines[-1]
