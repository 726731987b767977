"""The example job that `make demo` runs, end to end: real ranks, the tuner, the exporter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
def test_the_demo_trains_tunes_and_serves_metrics(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "examples/train_ddp.py",
            "--world-size",
            "2",
            "--steps",
            "40",
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "AUTOTUNE_STORAGE": f"sqlite:///{tmp_path / 'tuning.db'}",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", text).groups())  # type: ignore[union-attr]
    assert last < first  # it learns
    assert re.search(r"^tuner: ", text, re.M)
    # The plain verdict leads the summary, and no line contradicts it.
    lines = text.splitlines()
    [verdict] = [i for i, line in enumerate(lines) if line.startswith("verdict: ")]
    summary = next(i for i, line in enumerate(lines) if line.startswith("2 ranks, cpu"))
    assert verdict == summary - 1, text
    assert re.match(
        r"verdict: (\d\.\d\dx step time: faster with autotune|no gain|provisional: .*still "
        r"to run: )",
        lines[verdict],
    ), text
    if "unhooked after" in lines[verdict]:
        assert "still exploring" not in text
    served = re.search(r"metrics: rank 0 served (\d+) samples in (\d+) metric families", text)
    assert served is not None, text
    assert int(served.group(1)) > 50 and int(served.group(2)) > 10
    assert "parameters bitwise identical on all 2 ranks: yes" in text
    assert (tmp_path / "tuning.db").exists()  # the plan was stored where it was told
    # It ends with the gain against plain DDP, or says it has not measured one yet; provisional
    # where the headline is.
    provisional = lines[verdict].startswith("verdict: provisional: ")
    lead = "autotune vs plain DDP, provisional: " if provisional else "autotune vs plain DDP: "
    assert text.splitlines()[-1].startswith(lead), text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for a machine without CUDA")
def test_the_example_refuses_cuda_where_this_torch_has_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    from train_ddp import parse_args

    with pytest.raises(SystemExit) as refused:
        parse_args(["--device", "cuda", "--world-size", "2"])
    assert refused.value.code == 2
    assert "--device cuda: this torch sees no CUDA device" in capsys.readouterr().err
