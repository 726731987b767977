"""Installing autotune (and its NCCL plugin) into an environment that has torch keeps that torch:
pip, offline, resolves the packages against what is installed and would add only themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import Distribution, distribution, distributions, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def _closure(name: str) -> set[str]:
    """The installed distributions ``name`` needs, itself included, extras left out."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = distribution(todo.pop())
        key = canonicalize_name(dist.metadata["Name"])
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _import_names(dist: Distribution) -> set[str]:
    """The top-level modules and regular packages ``dist`` installs (namespace packages, which
    several distributions share by design, left out)."""
    files = [f for f in dist.files or [] if f.parts and f.parts[0] != ".."]
    names = set()
    for f in files:
        top = f.parts[0]
        if top.endswith((".dist-info", ".data", ".egg-info")) or top == "__pycache__":
            continue
        if len(f.parts) == 1 and f.suffix in (".py", ".so", ".pyd"):
            names.add(top.split(".")[0])
        elif len(f.parts) == 2 and f.name == "__init__.py":
            names.add(top)
    return names


def _replacing(closure: set[str]) -> dict[str, set[str]]:
    """Import names a distribution of ``closure`` installs that belong to another project: one
    another installed distribution also installs, or one named as another project whose fork
    this distribution is (``urllib3`` from urllib3-future)."""
    installed: dict[str, Distribution] = {
        canonicalize_name(d.metadata["Name"]): d for d in distributions()
    }
    owners: dict[str, set[str]] = {}
    for key, dist in installed.items():
        for module in _import_names(dist):
            owners.setdefault(module, set()).add(key)
    found: dict[str, set[str]] = {}
    for owner in closure:
        for module in _import_names(installed[owner]):
            name = canonicalize_name(module)
            fork = name != owner and owner.startswith(f"{name}-")
            if fork or owners[module] - {owner}:
                found[module] = owners[module]
    return found


def test_autotune_adds_no_package_that_replaces_another_ones_import_name() -> None:
    # grafana-client's urllib3-future installs its own urllib3/ over urllib3's, which a
    # training environment's other tools import. Pushing dashboards is an extra now.
    assert not _replacing(_closure("autotune"))
    assert _replacing(_closure("grafana-client")) == {"urllib3": {"urllib3-future"}}
