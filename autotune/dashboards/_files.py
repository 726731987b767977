"""The dashboards as files: built from code into ``dashboards/*.json``, and checked against it."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.dashboards._communication import communication
from autotune.dashboards._gpus import gpus_and_host
from autotune.dashboards._sdk import Sdk, sdk
from autotune.util.jsonfile import read_json

__all__ = ["BUILDERS", "build", "differences", "load", "write"]

#: File name -> the function that builds that dashboard.
BUILDERS: dict[str, Callable[[Sdk], Any]] = {
    "communication.json": communication,
    "gpus-host.json": gpus_and_host,
}


def build() -> dict[str, str]:
    """Every dashboard's JSON text, by file name."""
    s = sdk()
    return {name: s.encode(make(s)) for name, make in BUILDERS.items()}


def write(directory: Path) -> list[Path]:
    """Write the built dashboards into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in build().items():
        path = directory / name
        path.write_text(text)
        paths.append(path)
    return paths


def differences(directory: Path) -> list[str]:
    """How the files in ``directory`` differ from what the code builds (empty: none)."""
    out = []
    for name, text in build().items():
        path = directory / name
        if not path.exists():
            out.append(f"{path}: missing (run `autotune dashboards build`)")
            continue
        committed = path.read_text()
        if committed != text:
            diff = difflib.unified_diff(
                committed.splitlines(), text.splitlines(), str(path), "built", lineterm="", n=1
            )
            out.append("\n".join(list(diff)[:40]))
    return out


def load(directory: Path) -> dict[str, dict[str, Any]]:
    """The dashboards' JSON in ``directory``, by uid (what push and report read)."""
    out = {}
    for name in BUILDERS:
        path = directory / name
        data = read_json(path, lambda d: {**d, "uid": str(d["uid"])}, "dashboard")
        out[data["uid"]] = data
    return out
