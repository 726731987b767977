"""``python -m autotune_nccl.selfcheck``: each tuner and profiler symbol as its NCCL calls it."""

from __future__ import annotations

import subprocess
import sys


def test_every_symbol_does_what_its_nccl_expects() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autotune_nccl.selfcheck"], capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    symbols = [line.split()[1] for line in lines]
    assert symbols == [f"ncclTunerPlugin_v{v}" for v in range(2, 8)] + [
        f"ncclProfiler_v{v}" for v in range(3, 7)
    ]
    assert all(line.startswith("ok ") for line in lines)
    assert "kernel 51.0 us (gpu clock)" in lines[-1] and "(host clock)" in lines[6]
