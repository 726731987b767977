"""The layer contract of autotune's package, checked in `make lint`.

Reads every module under autotune/ with `ast` (imports inside functions count, and so do those
under `if TYPE_CHECKING:`: a lower layer's signature that names a higher layer's type is a
dependency too, only deferred), then fails on an import circle among autotune's modules, on a
layer that imports one above it, on more loose modules directly in autotune/ than LOOSE_MAX, and
on a module longer than LINES_MAX (one idea per room: a longer one holds several).
Run: python tools/layers.py [--graph]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "autotune"

# Lowest first: a layer may import its own modules and those of layers before it, never after.
# A module not named here belongs to the top (the package's __init__, the CLI).
LAYERS: list[tuple[str, ...]] = [
    ("autotune.util",),
    ("autotune.comm",),
    ("autotune.algorithms",),
    ("autotune.plan",),
    ("autotune.config", "autotune.storage", "autotune.model"),
    ("autotune.ddp",),
    ("autotune.tuning",),
    ("autotune.metrics", "autotune.sweep"),
    (
        "autotune.comm_hook",
        "autotune.setup_checks",
        "autotune.wiring",
        "autotune.state",
        "autotune.frameworks",
        "autotune.report",
        "autotune.dashboards",
    ),
    ("autotune.cli", "autotune.testing"),
]
# Runtime code never imports test support.
RUNTIME_NEVER = "autotune.testing"
LOOSE_MAX = 8
LINES_MAX = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The autotune modules `name` imports, at any depth, TYPE_CHECKING blocks included."""
    return imports_in(path.read_text(), name, modules, path.name == "__init__.py")


def imports_in(source: str, name: str, modules: set[str], package_init: bool = False) -> set[str]:
    """The autotune modules the module ``name`` (whose code is ``source``) imports."""
    tree = ast.parse(source, name)
    package = name if package_init else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> None:
        # `from a.b import c` names the module a.b.c when there is one, else a.b.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith(PACKAGE):
                        resolve(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if base.startswith(PACKAGE):
                    for alias in child.names:
                        resolve(f"{base}.{alias.name}")
            visit(child)

    visit(tree)
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, name, modules) for name, path in paths.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def layer_of(name: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if any(name == top or name.startswith(top + ".") for top in layer):
            return rank
    return len(LAYERS)


def problems(edges: dict[str, set[str]]) -> list[str]:
    found = [f"import circle: {' <-> '.join(c)}" for c in circles(edges)]
    for name, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name) and name != PACKAGE:
                found.append(f"{name} imports {target}, a layer above it")
            if target.startswith(RUNTIME_NEVER) and not name.startswith(RUNTIME_NEVER):
                found.append(f"{name} imports test support {target}")
    loose = sorted(p.stem for p in (ROOT / PACKAGE).glob("*.py") if p.name not in ("__init__.py",))
    if len(loose) > LOOSE_MAX:
        found.append(f"{len(loose)} loose modules in autotune/ (at most {LOOSE_MAX}): {loose}")
    found += too_long(ROOT / PACKAGE)
    return found


def too_long(package: Path) -> list[str]:
    """The modules under ``package`` longer than LINES_MAX, each said with its length."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > LINES_MAX:
            name = path.relative_to(package.parent)
            found.append(
                f"{name} has {lines} lines (at most {LINES_MAX}): split it along its seams"
            )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print every module's imports")
    args = parser.parse_args()
    edges = graph()
    if args.graph:
        for name, targets in sorted(edges.items()):
            print(f"{name}: {' '.join(sorted(targets))}")
    found = problems(edges)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"layers: {len(edges)} modules, no circle, no upward import")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
