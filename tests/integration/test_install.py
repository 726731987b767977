"""Installing autotune (and its NCCL plugin) into an environment that has torch keeps that torch:
pip, offline, resolves the packages against what is installed and would add only themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def would_install(path: Path, tmp_path: Path) -> list[str]:
    """What ``pip install path`` would install here, without an index (nothing downloaded)."""
    report = tmp_path / f"{path.name}.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--quiet", "--report", str(report), str(path)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]


@pytest.mark.parametrize(
    ("path", "name"), [(ROOT, "autotune"), (ROOT / "plugins" / "autotune-nccl", "autotune-nccl")]
)
def test_pip_keeps_the_installed_torch(path: Path, name: str, tmp_path: Path) -> None:
    assert would_install(path, tmp_path) == [name]


def test_the_declared_torch_range_holds_the_installed_torch() -> None:
    declared = [Requirement(r) for r in requires("autotune") or [] if "extra ==" not in r]
    [torch] = [r for r in declared if r.name == "torch"]
    installed = version("torch").split("+")[0]
    assert torch.specifier.contains(installed), (str(torch.specifier), installed)
    assert not torch.specifier.contains("3.0") and torch.specifier.contains("2.6")
