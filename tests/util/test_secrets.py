"""A URL's password never reaches what autotune prints, logs, raises, stores or sends to peers.

Every path that names a URL is taken here with a password in it (`autotune.util.redact`).
"""

from __future__ import annotations

import json
import traceback

import pytest
from fault_jobs import register_with_storage

from autotune.cli import main
from autotune.comm.launch import run_local
from autotune.config import Config
from autotune.dashboards._push import PushError, push
from autotune.plan import Choice, Entry, Table
from autotune.report._prometheus import PrometheusClient
from autotune.storage import Store, storage_failure
from autotune.sweep._format import plan_lines
from autotune.sweep._result import SweepResult
from autotune.util.redact import redact

SECRET = "s3cr3t-Pa55"
# Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
PG_URL = f"postgresql+psycopg2://autotune:{SECRET}@127.0.0.1:9/tuning"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PG_URL, "postgresql+psycopg2://autotune:***@127.0.0.1:9/tuning"),
        ("mysql://u:p@ss@h/db", "mysql://u:***@h/db"),  # an unquoted '@' in the password
        ("http://admin:pw@localhost:3000/api", "http://admin:***@localhost:3000/api"),
        ("sqlite:////tmp/a.db and http://h:3000", "sqlite:////tmp/a.db and http://h:3000"),
        (
            "x://h/db?user=a&password=pw&sslmode=require",
            "x://h/db?user=a&password=***&sslmode=require",
        ),
        ("got 'u:pw@host'", "got 'u:***@host'"),  # no scheme: still somebody's password
        ("peer [127.0.0.1]:4242 closed at 08:51:19", "peer [127.0.0.1]:4242 closed at 08:51:19"),
        ("mail user@host", "mail user@host"),
        (
            "postgresql://autotune@127.0.0.1:9/db",
            "postgresql://autotune@127.0.0.1:9/db",
        ),  # no password
    ],
)
def test_redact_masks_passwords_and_keeps_the_rest(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_config_never_shows_the_password() -> None:
    config = Config(storage=PG_URL)
    assert SECRET not in repr(config) and "autotune:***@127.0.0.1:9" in repr(config)
    with pytest.raises(ValueError) as bad:
        Config(storage=f"autotune:{SECRET}@db")  # no scheme
    assert SECRET not in str(bad.value) and "Config.storage" in str(bad.value)
    with pytest.raises(ValueError) as bad_env:
        Config.from_env({"AUTOTUNE_STORAGE": f"autotune:{SECRET}@db"})
    assert SECRET not in str(bad_env.value) and "AUTOTUNE_STORAGE=" in str(bad_env.value)


def test_a_storage_that_cannot_open_never_shows_the_password() -> None:
    with pytest.raises(ValueError) as failed:
        Store(PG_URL)
    text = "".join(traceback.format_exception(failed.value))
    assert "cannot open tuning storage" in text and "Connection refused" in text
    assert SECRET not in text  # nor in a chained SQLAlchemy error, which repeats the URL


def test_show_says_why_in_one_line_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "--storage", PG_URL]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("autotune show: cannot open tuning storage") and SECRET not in err


@pytest.mark.distributed
def test_register_never_sends_the_password_between_ranks() -> None:
    results = run_local(register_with_storage, 2, PG_URL, timeout_s=120)
    (kind0, message0, stored), (kind1, message1, _) = results
    assert kind0 == "ValueError" and "autotune:***@127.0.0.1:9" in message0, message0
    assert kind1 == "PeerError" and "rank 0 failed: ValueError: cannot open" in message1, message1
    assert any("cannot open tuning storage" in v for v in stored), stored  # what rank 1 read
    for text in (message0, message1, *stored):
        assert SECRET not in text


def test_sweep_output_never_shows_the_password() -> None:
    table = Table({1024: Entry(Choice("ring", None), state="locked")}, None)
    assert not any(SECRET in line for line in plan_lines(table, "abc", PG_URL))
    result = SweepResult(2, "gloo", "cpu", "float", "autotune sweep", "m", {}, storage=PG_URL)
    assert SECRET not in json.dumps(result.to_json())


def test_prometheus_and_grafana_errors_never_show_the_password() -> None:
    with pytest.raises(RuntimeError) as unreachable:
        PrometheusClient(f"http://admin:{SECRET}@127.0.0.1:9", timeout_s=5).query("up")
    assert SECRET not in "".join(traceback.format_exception(unreachable.value))
    with pytest.raises(PushError) as bad_port:
        push(f"http://admin:{SECRET}@localhost:30x0", None, {})
    assert SECRET not in str(bad_port.value) and "admin:***@" in str(bad_port.value)


def test_a_storage_failure_mid_job_is_described_without_the_password() -> None:
    # What the tuner logs and broadcasts when its storage fails mid-job (tests/tuning/test_tuner.py
    # fails one for real); here the description of a failure whose text holds the URL.
    error = RuntimeError(f"lost {PG_URL}")
    assert SECRET not in storage_failure(error) and "autotune:***@" in storage_failure(error)
