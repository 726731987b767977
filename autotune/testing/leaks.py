"""A pytest plugin that fails a test which leaves a thread, a child process, a process group, an
emulated cluster's network namespace or a temporary file behind, and checks the whole run once
more at its end: a leaked non-daemon thread makes the interpreter wait forever after pytest's
summary, a leaked rank or server outlives the suite, and temporary files pile up in /tmp run
after run (torchrun's logs, a killed launcher's result files, multiprocessing's sockets).

Temporary files: the processes a test starts get a directory of the run's own as their
``TMPDIR``, checked empty after each test, and removed at the run's end. The test
process itself keeps the system's (pytest's own ``tmp_path`` lives there, and it cleans it).

Enable it with ``-p autotune.testing.leaks`` (autotune's own suite does, in ``conftest.py``).
It works under pytest-xdist: each worker checks what it (and its children) made, the clusters'
namespaces included (`autotune.testing.cluster.NETNS_TAG_ENV`).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from autotune.testing.cluster import NETNS_TAG_ENV, namespaces

__all__ = ["leftovers"]

#: How long a test's helpers get to wind down after it before they count as left behind
#: (``LEAKCHECK_GRACE_S`` overrides it).
GRACE_S = float(os.environ.get("LEAKCHECK_GRACE_S", "10"))

# multiprocessing's own long-lived helpers: one per interpreter, not per test.
_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def _children() -> dict[int, psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(h in " ".join(p.cmdline()) for h in _HELPERS):
                continue
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = p
    return out


def _under(p: psutil.Process, pids: set[int]) -> bool:
    """Whether ``p`` descends from one of ``pids`` (a server a wider fixture owns forks workers)."""
    try:
        return any(parent.pid in pids for parent in p.parents())
    except psutil.NoSuchProcess:
        return False


def _own_namespaces() -> list[str]:
    """The clusters' namespaces this run (this pytest-xdist worker) and its children made."""
    return namespaces(os.environ.get(NETNS_TAG_ENV))


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon}


def _process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def leftovers(
    threads_before: set[threading.Thread],
    children_before: set[int],
    group_before: bool = False,
    grace_s: float = GRACE_S,
    namespaces_before: frozenset[str] = frozenset(),
) -> list[str]:
    """What exists now that did not before (after ``grace_s`` to wind down), described."""
    deadline = time.monotonic() + grace_s
    while True:
        threads = [t for t in _threads() if t not in threads_before]
        children = [
            p
            for pid, p in _children().items()
            if pid not in children_before and not _under(p, children_before)
        ]
        if not (threads or children) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    found = [f"non-daemon thread {t.name!r} still running" for t in threads]
    for p in children:
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
            found.append(f"child process {p.pid} still running: {' '.join(p.cmdline())[:200]}")
    if _process_group() and not group_before:
        found.append("the default process group is still initialised (destroy_process_group)")
    found += [
        f"network namespace {ns!r} still exists (ip netns del {ns})"
        for ns in _own_namespaces()
        if ns not in namespaces_before
    ]
    return found


#: The run's own directory for its children's temporary files (None: not configured).
_scratch: str | None = None
_tmpdir_before: str | None = None


def _temporaries() -> set[str]:
    return set(os.listdir(_scratch)) if _scratch is not None else set()


def _temporaries_left(before: set[str]) -> list[str]:
    """What is in the run's ``TMPDIR`` beyond ``before``, described; removed, so that the next
    test is not blamed for it."""
    found = []
    for name in sorted(_temporaries() - before):
        assert _scratch is not None
        path = os.path.join(_scratch, name)
        found.append(f"temporary file {name!r} left in TMPDIR")
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return found


@pytest.fixture(autouse=True)
def _leaves_nothing_behind() -> Iterator[None]:
    threads, children, group = _threads(), set(_children()), _process_group()
    netns = frozenset(_own_namespaces())
    temporaries = _temporaries()
    yield
    found = leftovers(threads, children, group, namespaces_before=netns)
    found += _temporaries_left(temporaries)  # after the children's grace: they have ended
    if found:
        pytest.fail("the test left things behind:\n  " + "\n  ".join(found), pytrace=False)


_hang: list[str] = []
# Namespaces that existed before the run (another run's, on a shared host): not this run's leak.
_namespaces_at_start: frozenset[str] = frozenset()


def pytest_configure(config: pytest.Config) -> None:
    # This run's clusters (and its children's) are tagged with its pid: run beside another (a
    # pytest-xdist worker beside the next), each checks only the namespaces it made itself.
    os.environ[NETNS_TAG_ENV] = str(os.getpid())
    # This process keeps the system's temporary directory (set explicitly: tempfile caches its
    # choice, and would otherwise read TMPDIR again if anything reset it); its children get the
    # run's own. Each pytest-xdist worker makes its own (one test at a time runs there, so a file
    # found there after a test is that test's); the controller, which runs none, makes none:
    # its workers would take it for the system's.
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        return
    global _scratch, _tmpdir_before
    tempfile.tempdir = tempfile.gettempdir()
    _tmpdir_before = os.environ.get("TMPDIR")
    _scratch = tempfile.mkdtemp(prefix="autotune-tests-")
    os.environ["TMPDIR"] = _scratch
    # torch's compile cache is a cache, not a leftover: where it would be without this plugin.
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR",
        os.path.join(tempfile.tempdir, f"torchinductor_{getpass.getuser()}"),
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    global _namespaces_at_start
    _namespaces_at_start = frozenset(_own_namespaces())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the last fixture's teardown: nothing may be left at all (module and session
    fixtures included)."""
    found = leftovers({threading.main_thread()}, set(), namespaces_before=_namespaces_at_start)
    found += _temporaries_left(set())
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        text = "the test run left things behind:\n  " + "\n  ".join(found)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        _hang.extend(f for f in found if "thread" in f)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _scratch
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
        _scratch = None
        if _tmpdir_before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = _tmpdir_before
    if _hang:
        # After the summary: a non-daemon thread would otherwise keep the interpreter (and CI)
        # waiting forever at exit.
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.TESTS_FAILED))
