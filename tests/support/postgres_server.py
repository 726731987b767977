"""A real PostgreSQL for the shared-storage tests: Debian's server, started on a free loopback
port with its own data directory, stopped and removed afterwards. Missing, it skips a test outside
CI (saying what to install) and fails it under CI=true."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

from prometheus_server import free_port, require

INSTALL = "apt-get update && apt-get install -y postgresql"
#: Debian installs the server's programs here, off PATH.
BIN_DIRS = os.pathsep.join(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))


class Postgres:
    """A throwaway server; `database` makes a fresh database and returns its SQLAlchemy URL."""

    def __init__(self) -> None:
        initdb = require("initdb", INSTALL, BIN_DIRS)
        postgres = require("postgres", INSTALL, BIN_DIRS)
        import psycopg2  # type: ignore[import-untyped]  # the driver, from the test extra

        self._psycopg2: Any = psycopg2
        self.dir = tempfile.mkdtemp(prefix="autotune-postgres-")
        # PostgreSQL refuses to run as root: run it as Debian's postgres user then.
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        data = os.path.join(self.dir, "data")
        subprocess.run(
            [initdb, "-D", data, "-U", "autotune", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=120,
            **self._user,
        )
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "server.log"), "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                *(postgres, "-D", data, "-h", "127.0.0.1", "-p", str(self.port), "-k", self.dir),
                *("-c", "fsync=off", "-c", "max_connections=200"),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            **self._user,
        )
        self._made = 0
        self._wait_ready()

    def _connect(self, database: str = "postgres") -> Any:
        return self._psycopg2.connect(
            host="127.0.0.1", port=self.port, user="autotune", dbname=database
        )

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.process.returncode}: see {self.dir}"
                )
            try:
                self._connect().close()
                return
            except self._psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def database(self) -> str:
        """A new, empty database's URL (no schema: the first job to open it creates one)."""
        self._made += 1
        name = f"tuning{self._made}"
        connection = self._connect()
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        connection.close()
        return f"postgresql+psycopg2://autotune@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        # SIGINT: PostgreSQL's fast shutdown, which closes clients' connections. SIGTERM (smart)
        # waits for every client to leave, and a pooled connection of the test process's
        # never does: 30 s at every teardown.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
