"""The suite's own guard: a test that leaves a thread, a process group, an emulated cluster's
network namespace or a temporary file behind fails, and the run still ends (a leaked non-daemon
thread used to keep the interpreter waiting after the summary)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess

import pytest
from needs import unmet
from prometheus_server import free_port

from autotune.testing.cluster import NETNS_PREFIX, namespaces, unavailable

pytestmark = pytest.mark.distributed

LEAKY = """
import subprocess
import sys
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


def test_leaks_a_temporary_directory():
    # As torchrun leaves its logs, or a launcher killed outright its ranks' files.
    made = "import tempfile; tempfile.mkdtemp(prefix='leaky-')"
    subprocess.run([sys.executable, "-c", made], check=True)


def test_clean_after_a_leak():
    pass
"""


def run_leak_checked(pytester: pytest.Pytester) -> pytest.RunResult:
    """The inner run's files in a pytest of their own, under the leak plugin, with a short
    grace (the leaks there are meant to stay)."""
    os.environ["LEAKCHECK_GRACE_S"] = "0.5"
    try:
        return pytester.runpytest_subprocess(
            "-p", "autotune.testing.leaks", "-p", "no:cacheprovider", timeout=120
        )
    finally:
        del os.environ["LEAKCHECK_GRACE_S"]


def test_leftovers_fail_the_test_and_the_run_ends(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY.replace("{port}", str(free_port())))
    result = run_leak_checked(pytester)
    out = result.stdout.str()
    # Each leaking test fails in its teardown; the clean ones pass (the one after a leaked
    # temporary directory too: it was removed, and is not blamed on the next test).
    result.assert_outcomes(passed=5, errors=3)
    assert "non-daemon thread 'leaky' still running" in out
    assert "the default process group is still initialised" in out
    assert re.search(r"temporary file 'leaky-\w+' left in TMPDIR", out), out
    # The run says so at its end, and exits (instead of hanging on the thread) with a failure.
    assert "the test run left things behind" in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED


LEAKY_CLUSTER = """
import subprocess

from autotune.testing.cluster import Cluster


def test_leaks_a_cluster():
    Cluster(1, 1).__enter__()  # never closed: only its atexit removes it


def test_leaves_another_runs_namespace():
    # As another pytest-xdist worker's cluster would exist beside this run: not its business.
    subprocess.run(["ip", "netns", "add", "{other}"], check=True)
"""


@pytest.mark.needs_root
def test_a_leaked_namespace_fails_the_test_and_another_runs_does_not(
    pytester: pytest.Pytester,
) -> None:
    reason = unavailable()
    if reason is not None:
        unmet(f"the emulated cluster cannot be built here: {reason}")
    other = f"{NETNS_PREFIX}other-{secrets.token_hex(3)}"
    pytester.makepyfile(test_leaky=LEAKY_CLUSTER.replace("{other}", other))
    try:
        result = run_leak_checked(pytester)
    finally:
        subprocess.run(["ip", "netns", "del", other], capture_output=True)
    out = result.stdout.str()
    result.assert_outcomes(passed=2, errors=1)
    # The cluster's two namespaces (node and switch), named with the inner run's pid as its tag.
    leaked = re.findall(r"network namespace '(autotune-(\d+)-[0-9a-f]+-\w+)' still exists", out)
    assert len({name for name, _ in leaked}) == 2, out
    assert all(tag != str(os.getpid()) for _, tag in leaked)
    assert other not in out
    assert "the test run left things behind" in out
    # Gone once the inner run's interpreter exited (the cluster's atexit).
    assert not {name for name, _ in leaked} & set(namespaces())
