"""A storage that forgives: a path is SQLite, a job makes its directory, a read-only command makes
nothing and says so in one line, and says which storage it read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import Config
from autotune.storage import Store, storage_url
from autotune.storage.store import as_url, sqlite_path


def test_a_path_is_an_sqlite_file_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert as_url("tuning.db") == f"sqlite:///{tmp_path / 'tuning.db'}"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert as_url("~/x/t.db") == f"sqlite:///{tmp_path / 'x' / 't.db'}"
    assert as_url("postgresql://u:p@h/db") == "postgresql://u:p@h/db"
    assert Config(storage="tuning.db").storage == f"sqlite:///{tmp_path / 'tuning.db'}"
    assert sqlite_path("sqlite:////tmp/a.db") == Path("/tmp/a.db")
    assert sqlite_path("sqlite:///:memory:") is None and sqlite_path("mysql://h/db") is None


def test_an_sqlite_uri_filename_names_its_file_and_makes_no_directory_of_its_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's URI filenames (a read-only storage: mode=ro): the file is the URI's path. Read as
    # a relative path, "file:/tmp/..." made a directory named "file:" wherever the job ran.
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "a b" / "t.db"
    for url in (
        f"sqlite:///file:{db}?mode=ro&uri=true",
        f"sqlite:///file://{tmp_path / 'a%20b' / 't.db'}?uri=true",
        f"sqlite:///file://localhost{tmp_path / 'a%20b' / 't.db'}?uri=true&mode=ro",
    ):
        assert sqlite_path(url) == db, url
        assert storage_url(url) == url
    assert (tmp_path / "a b").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b"]
    assert sqlite_path("sqlite:///file:x.db?mode=memory&uri=true") is None
    assert sqlite_path("sqlite:///file:x.db?mode=ro") == Path("file:x.db")  # not a URI


def test_a_job_makes_its_storages_directory(tmp_path: Path) -> None:
    where = tmp_path / "not" / "yet" / "tuning.db"
    url = storage_url(str(where))
    assert url == f"sqlite:///{where}" and where.parent.is_dir()
    assert Store(url).tables() == {} and where.is_file()


def test_a_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError) as info:
        storage_url(str(tmp_path / "file" / "sub" / "tuning.db"))
    message = str(info.value)
    assert "\n" not in message and "cannot make" in message and str(tmp_path) in message


def test_read_only_never_creates_and_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "tuning.db"
    with pytest.raises(ValueError, match=r"no tuning storage at sqlite:///.*does not exist"):
        storage_url(str(missing), create=False)
    assert not missing.parent.exists()


def test_show_on_a_missing_storage_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    for given in (str(missing), f"sqlite:///{missing}"):
        out = subprocess.run(
            [sys.executable, "-m", "autotune.cli", "show", "--storage", given],
            capture_output=True, text=True,
        )  # fmt: skip
        assert out.returncode == 1, out
        assert out.stderr.count("\n") == 1 and "no tuning storage at" in out.stderr
        assert out.stdout == "" and not missing.exists()


def test_show_takes_a_path_and_names_the_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "tuning.db"
    Store(storage_url(str(db))).tables()  # an empty storage, made by a job
    assert main(["show", "--storage", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"storage: sqlite:///{db}"
    assert f"no tuned plans in sqlite:///{db}" in out


def test_optunas_info_lines_stay_out_of_the_log_unless_the_user_set_a_verbosity(
    tmp_path: Path,
) -> None:
    import optuna

    saved = optuna.logging.get_verbosity()
    try:
        optuna.logging.set_verbosity(optuna.logging.INFO)  # Optuna's default
        Store(storage_url(str(tmp_path / "a.db"))).study("k", "w")
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING
        optuna.logging.set_verbosity(optuna.logging.DEBUG)  # the user's own choice: kept
        Store(storage_url(str(tmp_path / "b.db"))).study("k", "w")
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
    finally:
        optuna.logging.set_verbosity(saved)


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        # SQLAlchemy's own words were "Can't load plugin: sqlalchemy.dialects:postgres".
        ("postgres://autotune@127.0.0.1:9/none", "names PostgreSQL 'postgresql://', not"),
        # A driver that is not installed was a bare "No module named 'MySQLdb'".
        ("mysql+mysqldb://autotune@127.0.0.1:9/none", "pip install mysqlclient"),
    ],
)
def test_a_storage_that_cannot_open_says_what_to_do(
    url: str, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "MySQLdb", None)  # not installed, wherever this runs
    with pytest.raises(ValueError, match="cannot open tuning storage") as info:
        Store(url)
    assert fix in str(info.value) and "\n" not in str(info.value), info.value
