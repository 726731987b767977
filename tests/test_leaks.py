"""The suite's own guard: a test that leaves a thread or a process group behind fails, and the run
still ends (a leaked non-daemon thread used to keep the interpreter waiting after the summary)."""

from __future__ import annotations

import os

import pytest
from prometheus_server import free_port

LEAKY = """
import threading

import torch.distributed as dist

stop = threading.Event()


def test_clean():
    pass


def test_leaks_a_thread():
    threading.Thread(target=stop.wait, name="leaky").start()


def test_leaks_a_process_group():
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
"""


def test_leftovers_fail_the_test_and_the_run_ends(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY.replace("{port}", str(free_port())))
    os.environ["LEAKCHECK_GRACE_S"] = "0.5"
    try:
        result = pytester.runpytest_subprocess(
            "-p", "autotune.testing.leaks", "-p", "no:cacheprovider", timeout=120
        )
    finally:
        del os.environ["LEAKCHECK_GRACE_S"]
    out = result.stdout.str()
    # Each leaking test fails in its teardown; the clean one passes.
    result.assert_outcomes(passed=3, errors=2)
    assert "non-daemon thread 'leaky' still running" in out
    assert "the default process group is still initialised" in out
    # The run says so at its end, and exits (instead of hanging on the thread) with a failure.
    assert "the test run left things behind" in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED
