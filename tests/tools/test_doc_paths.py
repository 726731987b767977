"""`tools/doc_paths.py`, the lint that every path of the tree a doc names exists."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doc_paths", ROOT / "tools" / "doc_paths.py")
assert _spec is not None and _spec.loader is not None
doc_paths = importlib.util.module_from_spec(_spec)
sys.modules["doc_paths"] = doc_paths
_spec.loader.exec_module(doc_paths)

TEXT = """\
Read `autotune/state.py` and [the tuner](docs/TUNER.md), and `tests/tuning/`.
A moved file: `plugins/autotune-nccl/tests/profiler_abi.py` (it was once there).
Not checked: `docs/sweeps/sweep-{2,4}.json`, `autotune/step_ratio` (a logger key),
`NVIDIA/nccl:plugins/tuner/example/nccl/tuner.h` (another project's), `python tools/layers.py`.

```
autotune report docs/sweeps/missing.json   # a command, in a fenced block
```
"""


def test_it_names_the_paths_a_doc_gives_and_skips_what_is_not_a_path_here() -> None:
    found = [path for _, path in doc_paths.named_paths(TEXT, doc_paths.tops())]
    assert found == [
        "autotune/state.py",
        "docs/TUNER.md",
        "tests/tuning/",
        "plugins/autotune-nccl/tests/profiler_abi.py",
    ]
    lines = dict((path, line) for line, path in doc_paths.named_paths(TEXT, doc_paths.tops()))
    assert lines["plugins/autotune-nccl/tests/profiler_abi.py"] == 2


def test_every_path_the_docs_name_is_in_the_tree() -> None:
    assert doc_paths.missing() == []
