"""What a test does when something it needs from the machine is missing: skip outside CI, saying
how to get it; fail under CI=true, where .ci/run was to provide it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unmet(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message + "; .ci/run provides it")
    pytest.skip(message)
