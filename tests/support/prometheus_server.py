"""A real Prometheus for the tests: the Debian package, started on a free loopback port with its
own config and data directory, stopped afterwards. Missing binaries skip a test outside CI (with
what to install) and fail it under CI=true."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from needs import unmet

INSTALL = "apt-get update && apt-get install -y prometheus"


def require(binary: str, install: str = INSTALL, path: str | None = None) -> str:
    """The binary's path; skip (outside CI) or fail (under CI=true) if it is not installed.

    ``path``: where else to look (Debian keeps PostgreSQL's programs off PATH)."""
    path = shutil.which(binary, path=path) or shutil.which(binary)
    if path is None:
        unmet(f"{binary} is not installed (Debian: {install})")
    return path


def free_port(consecutive: int = 1) -> int:
    """A port such that it and the next ``consecutive - 1`` were free a moment ago."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        sockets = []
        try:
            for offset in range(consecutive):
                t = socket.socket()
                sockets.append(t)
                t.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        finally:
            for t in sockets:
                t.close()
        return base
    raise RuntimeError("no free ports")


class Prometheus:
    """A Prometheus server scraping ``targets`` (host:port) every second."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        job: str = "autotune",
        more: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Scrape ``targets`` as ``job`` (honouring their own job labels, as
        dashboards/prometheus.yml does), and ``more``: other jobs' targets."""
        binary = require("prometheus")
        self.port = free_port()
        config = workdir / "prometheus.yml"
        text = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
        for name, listed, honor in [(job, targets, True)] + [
            (n, t, False) for n, t in (more or {}).items()
        ]:
            quoted = ", ".join(f'"{t}"' for t in listed)
            text += (
                f"  - job_name: {name}\n    honor_labels: {str(honor).lower()}\n"
                f"    static_configs:\n      - targets: [{quoted}]\n"
            )
        config.write_text(text)
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on an error response)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        if body["status"] != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, promql: str, ranks: set[str], timeout_s: float = 60) -> list[dict[str, Any]]:
        """Poll ``promql`` until it returns series for every rank in ``ranks``."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if ranks <= {r["metric"].get("rank") for r in result}:
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql}: no series for ranks {ranks} in {timeout_s}s: {result}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def promtool_check_metrics(exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
    )
