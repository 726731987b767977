"""Which NCCL a process runs: what the library answers, not the header torch was built with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.comm.nccl_version import decode, runtime_version


def test_decode_reads_both_of_nccls_encodings() -> None:
    assert decode(23007) == (2, 30, 7)  # 2.9 and later: major * 10000 + minor * 100 + patch
    assert decode(22809) == (2, 28, 9)
    assert decode(2708) == (2, 7, 8)  # before 2.9: major * 1000 + minor * 100 + patch
    with pytest.raises(ValueError, match="-1"):
        decode(-1)


@pytest.mark.skipif(torch.distributed.is_nccl_available(), reason="this torch carries NCCL")
def test_a_torch_without_nccl_runs_none() -> None:
    assert runtime_version() is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (apt-get install gcc)")
def test_a_preloaded_library_is_the_one_reported(tmp_path: Path) -> None:
    # What LD_PRELOAD=libnccl.so.2 (NCCL 2.30.7) does on a GPU machine: torch.cuda.nccl.version()
    # still says the wheel's header (2.28.9 on torch 2.11), the library says 2.30.7.
    src = tmp_path / "nccl.c"
    src.write_text("int ncclGetVersion(int *v) { *v = 23007; return 0; }\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", lib, src], check=True
    )
    env = {**os.environ, "LD_PRELOAD": str(lib)}
    out = subprocess.run(
        [sys.executable, "-m", "autotune.comm.nccl_version"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "2.30.7"
