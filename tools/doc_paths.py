"""Every path of this tree a doc names exists, checked in `make lint`.

Reads README.md, docs/ and each plugin's README, takes every `inline code` span and link
target that starts with one of the tree's top-level folders and names a file (it has an
extension) or a folder (it ends in "/"), and fails on those that are not there, relative to the
tree's root or to the doc. Spans with a pattern in them (``*``, ``{``, ``<``, ``$``) are not
checked, nor fenced code blocks (commands and sample output), nor a span that says whose tree it
is in (``NVIDIA/nccl:plugins/...``; a doc that names another project's file says so that way).
Run: python tools/doc_paths.py
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = (".py", ".md", ".json", ".sh", ".c", ".h", ".toml", ".yml", ".yaml", ".txt", ".cfg")
_SPAN = re.compile(r"`([^`\n]+)`|\]\(([^)\s]+)\)")
_PATTERN = re.compile(r"[*{<$]")


def docs() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted(ROOT.glob("plugins/*/README.md")),
    ]


def tops() -> set[str]:
    """The tree's top-level folders a path may start with."""
    return {
        p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".git", ".venv"))
    }


def named_paths(text: str, roots: set[str]) -> Iterator[tuple[int, str]]:
    """(line, path) for each path of this tree ``text`` names outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _SPAN.finditer(line):
            token = (match.group(1) or match.group(2) or "").strip()
            token = token.split("#")[0].split("::")[0]
            if not token or _PATTERN.search(token) or " " in token or ":" in token:
                continue
            head = token.split("/")[0]
            if head not in roots or "/" not in token:
                continue
            if token.endswith("/") or token.endswith(EXTENSIONS):
                yield number, token


def missing() -> list[str]:
    roots = tops()
    out = []
    for doc in docs():
        for number, path in named_paths(doc.read_text(encoding="utf-8"), roots):
            if not (ROOT / path).exists() and not (doc.parent / path).exists():
                out.append(f"{doc.relative_to(ROOT)}:{number}: {path} does not exist")
    return out


def main() -> int:
    problems = missing()
    for problem in problems:
        print(problem)
    if problems:
        print(f"doc paths: {len(problems)} paths named in the docs are not in the tree")
        return 1
    print(f"doc paths: {len(docs())} docs, every path they name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
