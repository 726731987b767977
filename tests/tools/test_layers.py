"""`tools/layers.py`, the lint that autotune's modules import only downward and in no circle,
counting the imports under ``if TYPE_CHECKING:`` (a signature that names a type is a dependency)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("layers", ROOT / "tools" / "layers.py")
assert _spec is not None and _spec.loader is not None
layers = importlib.util.module_from_spec(_spec)
sys.modules["layers"] = layers
_spec.loader.exec_module(layers)

MODULES = {"autotune.plan", "autotune.algorithms._base", "autotune.tuning.status",
           "autotune.tuning.tuner"}  # fmt: skip


def test_an_import_under_type_checking_counts() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from autotune.plan import Choice\n"
    )
    assert layers.imports_in(source, "autotune.algorithms._base", MODULES) == {"autotune.plan"}


def test_a_type_checking_import_that_points_up_or_closes_a_circle_fails() -> None:
    up = {"autotune.algorithms._base": {"autotune.plan"}, "autotune.plan": set()}
    assert layers.problems(up) == [
        "autotune.algorithms._base imports autotune.plan, a layer above it"
    ]
    circle = {
        "autotune.tuning.status": {"autotune.tuning.tuner"},
        "autotune.tuning.tuner": {"autotune.tuning.status"},
    }
    assert layers.problems(circle) == [
        "import circle: autotune.tuning.status <-> autotune.tuning.tuner"
    ]


def test_the_package_passes() -> None:
    assert layers.problems(layers.graph()) == []


def test_a_module_over_the_line_limit_fails(tmp_path: Path) -> None:
    package = tmp_path / "autotune"
    (package / "ddp").mkdir(parents=True)
    (package / "ddp" / "engine.py").write_text("x = 1\n" * (layers.LINES_MAX + 1))
    (package / "ddp" / "lane.py").write_text("x = 1\n" * layers.LINES_MAX)
    assert layers.too_long(package) == [
        f"autotune/ddp/engine.py has {layers.LINES_MAX + 1} lines (at most {layers.LINES_MAX}): "
        "split it along its seams"
    ]
