"""The library keeps a shared file per process for ``autotune daemon`` (docs/NCCL_PROFILER.md):
the tests' processes keep theirs in a directory of the session's, not in the node's /dev/shm."""

from __future__ import annotations

import os
import tempfile

# At import, before any test initialises NCCL's side of the library (ranks inherit it).
os.environ.setdefault("AUTOTUNE_NCCL_SHM_DIR", tempfile.mkdtemp(prefix="autotune-nccl-shm-"))
