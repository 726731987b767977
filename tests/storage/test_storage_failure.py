"""A tuning storage that fails mid-job: the cause named once, tuning stopped on every rank alike,
the job training on with the plan it has, and every rank's `state.locked` the same at every step.

The failures are real: an SQLite file opened read-only (it fails at the job's first write), one
overwritten mid-job (corrupt), a PostgreSQL server shut down mid-job (gone).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from fault_jobs import StorageRun, storage_fails
from postgres_server import Postgres

from autotune.comm.launch import run_local
from autotune.storage import Store, storage_failure


def _sqlite_error(path: Path, *, read_only: bool = False) -> BaseException:
    connection = sqlite3.connect(f"file:{path}?mode=ro" if read_only else path, uri=read_only)
    try:
        connection.execute("insert into t values (1)")
        connection.commit()
    except sqlite3.DatabaseError as exc:
        return exc
    finally:
        connection.close()
    raise AssertionError("the write succeeded")


@pytest.mark.distributed
def test_each_cause_is_named_in_the_databases_words(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    sqlite3.connect(db).execute("create table t(x)").connection.commit()
    assert storage_failure(_sqlite_error(db, read_only=True)).startswith(
        "read-only: OperationalError: attempt to write a readonly database"
    )
    with open(db, "r+b") as f:  # every page past the header
        f.seek(100)
        f.write(b"\xa5" * (db.stat().st_size - 100))
    assert storage_failure(_sqlite_error(db)).startswith("corrupt: DatabaseError")
    # A file that may not grow (a full disk, as a file-size limit makes one), in a process of
    # its own: SQLite says "disk I/O error".
    grow = (
        "import resource, signal, sqlite3; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
        f"c = sqlite3.connect({str(tmp_path / 'big.db')!r}); c.execute('create table t(x)');"
        "c.commit(); resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY));"
        "c.execute('insert into t values (zeroblob(100000))'); c.commit()"
    )
    out = subprocess.run([sys.executable, "-c", grow], capture_output=True, text=True)
    assert "disk I/O error" in out.stderr, out.stderr
    assert storage_failure(sqlite3.OperationalError("disk I/O error")).startswith("I/O error")


def test_optunas_own_message_gives_way_to_the_cause(tmp_path: Path) -> None:
    # What the tuner's worker gets: Optuna's StorageInternalError ("exception is raised during
    # the commit ... exceeding max length"), the driver's error two levels down.
    url = f"sqlite:///{tmp_path / 't.db'}"
    Store(url).study("k", "plan")
    store = Store(f"sqlite:///file:{tmp_path / 't.db'}?mode=ro&uri=true")
    with pytest.raises(optuna.exceptions.StorageInternalError) as failed:
        store.study("k", "plan").ask()
    assert "exceeding max length" in str(failed.value)
    assert storage_failure(failed.value).startswith(
        "read-only: OperationalError: attempt to write a readonly database"
    )


# A cap, not the job's length (it ends 5 steps after it locked and unhooked): the failure is named
# when Optuna gives up, and Optuna retries a trial's creation 5 times, up to 2 s apart (8 s at
# most), however many steps that is. At 400 steps a loaded machine's job ended before it had.
_STEPS = 20_000


def _check(runs: list[StorageRun], cause: str) -> None:
    first, *others = runs
    for run in runs:
        # Every rank: the same `locked` at every step, tuning stopped, the baseline locked and
        # DDP on its own from the same iteration; training went on to the end.
        assert run.locked == first.locked and run.locked[-1], (run.locked, first.locked)
        assert run.frozen and run.aside_at == first.aside_at is not None
    told = [line for line in first.logged if "storage failed" in line]
    assert len(told) == 1 and f"its tuning storage failed: {cause}" in told[0], first.logged
    assert not any("storage failed" in line for run in others for line in run.logged)
    assert f"tuning stopped: the tuning storage failed, {cause}" in first.verdict, first.verdict


@pytest.mark.distributed
def test_a_read_only_storage(tmp_path: Path) -> None:
    Store(f"sqlite:///{tmp_path / 't.db'}")  # the schema, written once
    url = f"sqlite:///file:{tmp_path / 't.db'}?mode=ro&uri=true"
    _check(run_local(storage_fails, 2, url, "read-only", -1, _STEPS, timeout_s=300), "read-only")


@pytest.mark.distributed
@pytest.mark.parametrize("at", [0, 10])
def test_a_storage_corrupted_mid_job(tmp_path: Path, at: int) -> None:
    # At 0: before the tuner loaded the stored plan (the ranks disagreed on `locked` for the
    # rest of the job, and it never unhooked); at 10: while it screens.
    url = f"sqlite:///{tmp_path / 't.db'}"
    _check(run_local(storage_fails, 2, url, "corrupt", at, _STEPS, timeout_s=300), "corrupt")


@pytest.mark.distributed
@pytest.mark.needs_server
def test_a_storage_whose_server_goes_away_mid_job() -> None:
    server = Postgres()
    try:
        url = server.database()
        pid = server.process.pid
        _check(run_local(storage_fails, 2, url, "gone", 10, _STEPS, pid, timeout_s=300), "gone")
    finally:
        server.close()
