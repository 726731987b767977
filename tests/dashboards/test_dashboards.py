"""The Grafana dashboards, Prometheus config and alert rules, checked against real data.

A real Prometheus (the Debian package) scrapes a real 2-rank training run and an `autotune daemon`
whose NVML query is a stand-in for two GPUs (this machine has none): every panel's PromQL must
return series. promtool checks the config and the rules and runs the rules' unit tests. The push
command talks to a small local HTTP server that plays Grafana's API: it is not a real Grafana,
which is not installable here; it checks each request it receives.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_gpus import H100, H100_B, FakeNvml
from metrics_jobs import serve_while_training
from prometheus_server import Prometheus, free_port, require

from autotune.comm.launch import launch
from autotune.dashboards import VARIABLES, differences, load, panel_queries, substitute
from autotune.metrics import run_daemon
from autotune.report import PrometheusClient, Series, render_dashboard

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="grafana-foundation-sdk 0.0.21 needs Python >= 3.11"
)
def test_the_committed_dashboards_are_what_the_code_builds() -> None:
    problems = differences(DASHBOARDS)
    assert not problems, "\n".join(problems)


def test_dashboards_have_the_variables_and_panels_asked_for() -> None:
    boards = load(DASHBOARDS)
    assert set(boards) == {"autotune-communication", "autotune-gpus-host"}
    for uid, board in boards.items():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:3] == ["datasource", "job", "instance"], uid
        for p in board["panels"]:
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p
    comm = {q.panel for q in panel_queries(boards["autotune-communication"])}
    for title in (
        "Latency p50 by size class",
        "Latency p99 by size class",
        "Latency heatmap",
        "Bus bandwidth by algorithm",
        "Plan per size class",
        "Tuner state by size class",
        "Tuner trials by size class",
        "Step time against plain DDP",
        "Compression error by size class",
        "Exposed communication per iteration",
        "Straggler wait by rank",
        "NCCL kernel time p50 by collective and size class",
        "Regret of NCCL's own choice",
    ):
        assert title in comm
    assert "rank" in [v["name"] for v in boards["autotune-communication"]["templating"]["list"]]
    gpus = {q.panel for q in panel_queries(boards["autotune-gpus-host"])}
    for title in (
        "GPU utilization",
        "GPU framebuffer memory used",
        "GPU power usage",
        "GPU energy over the time range",
        "GPU temperature",
        "GPU SM clocks",
        "PCIe throughput",
        "NVLink throughput",
        "Host CPU busy",
        "Host memory used",
        "Host network",
    ):
        assert title in gpus


def test_panel_queries_carry_each_panels_unit() -> None:
    units = {q.panel: q.unit for q in panel_queries(load(DASHBOARDS)["autotune-communication"])}
    assert units["Latency p50 by size class"] == "s"
    assert units["Latency heatmap"] == "s"  # a heatmap keeps it on its y axis
    assert units["Bus bandwidth by algorithm"] == "Bps"


@pytest.mark.distributed
@pytest.mark.needs_server
def test_promtool_checks_the_config_and_rules_and_their_unit_tests() -> None:
    promtool = require("promtool")
    for args in (
        ["check", "config", "prometheus.yml"],  # also checks alerts.yml, which it loads
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        out = subprocess.run(
            [promtool, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"
        assert "SUCCESS" in out.stdout + out.stderr


def test_docker_compose_mounts_files_that_exist() -> None:
    compose = yaml.safe_load((DASHBOARDS / "docker-compose.yml").read_text())
    mounted = []
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                mounted.append(source)
                assert (DASHBOARDS / source).exists(), source
    assert {"./prometheus.yml", "./alerts.yml", "./provisioning"} <= set(mounted)
    assert {f"./{name}" for name in ("communication.json", "gpus-host.json")} <= set(mounted)
    provider = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/autotune.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    grafana_volumes = compose["services"]["grafana"]["volumes"]
    assert all(v.split(":")[1].startswith(path) for v in grafana_volumes if v.endswith(".json:ro"))


# -- every panel against a real Prometheus -----------------------------------------------------

#: Two stand-in GPUs for the daemon.
GPUS = [H100, H100_B]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    """A real Prometheus that has scraped a real 2-rank training run (with the tuner on, bf16
    on the wire allowed, and a played NCCL that loaded autotune's plugins beside it) and an
    autotune daemon serving two stand-in GPUs, for at least 20 seconds."""
    require("prometheus")  # skip (or fail under CI) before anything is started
    tmp = tmp_path_factory.mktemp("scraped")
    base, daemon_port = free_port(consecutive=2), free_port()
    stop_daemon, ready = threading.Event(), threading.Event()
    stop = tmp / "stop"
    storage = f"sqlite:///{tmp / 'tuning.db'}"
    results: list[Any] = []
    # The ranks' NCCL (played: tests/jobs/metrics_jobs.py) keeps its node files here; their
    # exporters serve its series, so the daemon, reading the same directory, leaves them out.
    nccl_dir = tmp / "nccl"
    nccl_dir.mkdir()
    daemon = threading.Thread(
        target=run_daemon,
        args=("127.0.0.1", daemon_port),
        kwargs={
            "nvml": FakeNvml(GPUS), "stop": stop_daemon, "ready": ready,
            "nccl_dir": str(nccl_dir),
        },
    )  # fmt: skip
    env = {"AUTOTUNE_NCCL_SHM_DIR": str(nccl_dir)}
    job = threading.Thread(
        target=lambda: results.extend(
            launch(
                serve_while_training,
                2,
                base,
                storage,
                str(stop),
                True,
                ("bf16",),
                timeout_s=300,
                env=env,
            )
        )
    )
    prometheus: Prometheus | None = None
    try:
        daemon.start()
        ready.wait(30)
        prometheus = Prometheus(
            tmp,
            [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"],
            more={"autotune-daemon": [f"127.0.0.1:{daemon_port}"]},
        )
        job.start()
        client = PrometheusClient(f"http://127.0.0.1:{prometheus.port}")
        prometheus.wait_for("autotune_tuner_best_latency_seconds", {"0"}, timeout_s=120)
        prometheus.wait_for("autotune_step_ratio", {"0", "1"}, timeout_s=120)
        time.sleep(20)  # rates over a few scrapes, a tuner that has switched a few times
        yield client
    finally:
        stop.touch()
        if job.is_alive():
            job.join(120)
        stop_daemon.set()
        if daemon.is_alive():
            daemon.join(30)
        if prometheus is not None:
            prometheus.close()
    assert len(results) == 2 and all(r.ok for r in results), results


@pytest.mark.distributed
@pytest.mark.needs_server
@pytest.mark.parametrize("uid", ["autotune-communication", "autotune-gpus-host"])
def test_every_panel_query_returns_series_from_a_real_run(
    scraped: PrometheusClient, uid: str
) -> None:
    board = load(DASHBOARDS)[uid]
    values = {**VARIABLES, "__rate_interval": "10s"}  # a 1 s scrape interval here
    empty, failed = [], []
    for q in panel_queries(board):
        expr = substitute(q.expr, values)
        try:
            got = scraped.query(expr)
        except ValueError as exc:
            failed.append(f"{q.panel} [{q.ref}]: {exc}")
            continue
        if not got:
            empty.append(f"{q.panel} [{q.ref}]: {expr}")
    assert not failed, "queries Prometheus rejected:\n" + "\n".join(failed)
    assert not empty, "queries with no series:\n" + "\n".join(empty)
    # The template variables' own queries (Grafana's label_values) have values too.
    for v in board["templating"]["list"]:
        if v["type"] != "query":
            continue
        inner = v["query"].removeprefix("label_values(").removesuffix(")")
        match, _, label = inner.rpartition(",")
        assert scraped.label_values(label.strip(), substitute(match, values)), v["name"]


@pytest.mark.distributed
@pytest.mark.needs_server
def test_host_panels_show_one_line_per_machine_however_many_exporters_report_it(
    scraped: PrometheusClient,
) -> None:
    # Both ranks and the daemon report this machine's readings: three exporters, one machine.
    raw = scraped.query("autotune_host_cpus")
    assert len({r.labels["instance"] for r in raw}) == 3
    assert {r.labels["Hostname"] for r in raw} == {socket.gethostname()}
    board = load(DASHBOARDS)["autotune-gpus-host"]
    values = {**VARIABLES, "__rate_interval": "10s"}
    by_panel: dict[str, list[Series]] = {}
    for q in panel_queries(board):
        if q.panel in ("Host CPU busy", "Host memory used", "Host network"):
            by_panel.setdefault(q.panel, []).extend(scraped.query(substitute(q.expr, values)))
    assert len(by_panel["Host CPU busy"]) == 1
    assert 0 <= by_panel["Host CPU busy"][0].points[0][1] <= 1
    assert len(by_panel["Host memory used"]) == 1
    interfaces = [r.labels["interface"] for r in by_panel["Host network"]]
    assert len(interfaces) == 2 * len(set(interfaces))  # RX and TX, once per interface


@pytest.mark.distributed
@pytest.mark.needs_server
def test_report_draws_each_dashboard_from_prometheus(
    scraped: PrometheusClient, tmp_path: Path
) -> None:
    boards = load(DASHBOARDS)
    for uid, board in boards.items():
        path = tmp_path / f"{uid}.png"
        counts = render_dashboard(scraped, board, str(path), minutes=2)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert counts and all(n > 0 for n in counts.values()), counts
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "report",
            "--prometheus",
            scraped.url,
            "--minutes",
            "2",
            "-o",
            str(tmp_path / "cli"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == [
        "autotune-communication.png",
        "autotune-gpus-host.png",
    ]


def test_a_variable_without_a_value_is_an_error() -> None:
    assert substitute('up{job=~"$job"}[$__rate_interval]') == 'up{job=~".*"}[1m]'
    assert substitute("${rank}") == ".*"
    with pytest.raises(KeyError, match=r"\$node has no value"):
        substitute('up{node="$node"}')


# -- push ------------------------------------------------------------------------------------

TOKEN = "glsa_test-token-3f9c2b7e"


class FakeGrafana(ThreadingHTTPServer):
    """Plays the part of Grafana's HTTP API that push uses (it is not a real Grafana): folders,
    and dashboards by uid. It checks every request's credentials and body."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.folders: dict[str, str] = {}  # uid -> title
        self.dashboards: dict[str, dict[str, Any]] = {}  # uid -> {"dashboard", "folderUid"}
        self.requests: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.accept = {f"Bearer {TOKEN}", "Basic " + base64.b64encode(b"admin:pw").decode()}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeGrafana

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        self.server.requests.append((self.command, self.path))
        if self.headers.get("Authorization") not in self.server.accept:
            self._reply(401, {"message": "invalid API key"})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.startswith("/api/folders"):
            self._reply(200, [{"uid": u, "title": t} for u, t in self.server.folders.items()])
        elif self.path.startswith("/api/dashboards/uid/"):
            uid = self.path.rsplit("/", 1)[1]
            stored = self.server.dashboards.get(uid)
            if stored is None:
                self._reply(404, {"message": "Dashboard not found"})
            else:
                meta = {"folderUid": stored["folderUid"]}
                self._reply(200, {"dashboard": stored["dashboard"], "meta": meta})
        else:
            self._reply(404, {"message": "not found"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/api/folders":
            self.server.folders[body["uid"]] = body["title"]
            self._reply(200, {"uid": body["uid"], "title": body["title"]})
        elif self.path == "/api/dashboards/db":
            d = body.get("dashboard", {})
            if not (d.get("uid") and body.get("overwrite") is True and "panels" in d):
                self.server.problems.append(f"bad save: {sorted(body)}")
            if body.get("folderUid") not in self.server.folders:
                self.server.problems.append(f"unknown folder {body.get('folderUid')}")
            stored = {**d, "id": 7, "version": 1 + len(self.server.requests)}  # as Grafana does
            self.server.dashboards[d["uid"]] = {"dashboard": stored, "folderUid": body["folderUid"]}
            self._reply(200, {"status": "success", "uid": d["uid"]})
        else:
            self._reply(404, {"message": "not found"})


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    server = FakeGrafana()
    yield server
    server.close()


def push(url: str, token: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_TOKEN"}
    if token is not None:
        env["GRAFANA_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", "dashboards", "push", "--url", url, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("localhost:3000", "--url must be a Grafana address such as http://localhost:3000"),
        ("http://", "--url must be a Grafana address"),
        ("http://grafana:port/", "--url 'http://grafana:port/': Port could not be cast"),
    ],
)
def test_push_refuses_a_malformed_url(url: str, words: str) -> None:
    result = push(url, TOKEN)
    assert result.returncode == 1
    assert f"autotune dashboards push: {words}" in result.stderr
    assert "Traceback" not in result.stderr


def test_push_without_grafana_client_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # grafana-client is an extra (autotune[grafana]): a training environment has no web stack.
    import autotune.cli

    monkeypatch.setitem(sys.modules, "grafana_client", None)  # not installed
    monkeypatch.setitem(sys.modules, "grafana_client.api", None)
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert autotune.cli.main(["dashboards", "push", "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "needs grafana-client, which is not installed here: pip install 'autotune[grafana]'" in (
        err
    )


@pytest.mark.distributed
def test_push_creates_then_leaves_alone_then_updates(grafana: FakeGrafana, tmp_path: Path) -> None:
    first = push(grafana.url, TOKEN)
    assert first.returncode == 0, first.stderr
    assert "created folder 'autotune'" in first.stdout
    assert first.stdout.count("created    ") == 2
    assert set(grafana.dashboards) == {"autotune-communication", "autotune-gpus-host"}
    assert not grafana.problems, grafana.problems
    stored = grafana.dashboards["autotune-communication"]["dashboard"]
    assert {k: v for k, v in stored.items() if k not in ("id", "version")} == {
        k: v for k, v in load(DASHBOARDS)["autotune-communication"].items() if k != "id"
    }

    posts = sum(1 for method, _ in grafana.requests if method == "POST")
    second = push(grafana.url, TOKEN)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("unchanged  ") == 2 and "0 changed" in second.stdout
    assert sum(1 for method, _ in grafana.requests if method == "POST") == posts  # idempotent

    # A changed dashboard is updated in place, by uid.
    edited = tmp_path / "dashboards"
    edited.mkdir()
    for name in ("communication.json", "gpus-host.json"):
        data = json.loads((DASHBOARDS / name).read_text())
        if name == "communication.json":
            data["title"] = "autotune / Communication (edited)"
        (edited / name).write_text(json.dumps(data))
    third = push(grafana.url, TOKEN, "--dir", str(edited))
    assert third.returncode == 0, third.stderr
    assert "updated    autotune / Communication (edited)" in third.stdout
    assert "1 changed" in third.stdout
    for out in (first, second, third):
        assert TOKEN not in out.stdout + out.stderr


@pytest.mark.distributed
def test_push_never_shows_the_token_or_password(grafana: FakeGrafana) -> None:
    wrong = "glsa_wrong-token-0000"
    out = push(grafana.url, wrong)
    assert out.returncode == 1
    assert "Unauthorized" in out.stderr and "GRAFANA_TOKEN" in out.stderr
    assert wrong not in out.stdout + out.stderr
    # user:password in the URL (a local Grafana): basic auth, and the password never printed.
    with_password = grafana.url.replace("http://", "http://admin:pw@")
    out = push(with_password, None)
    assert out.returncode == 0, out.stderr
    assert "pw@" not in out.stdout + out.stderr
    assert grafana.url.replace("http://", "http://admin:***@") in out.stdout  # autotune.util.redact
    # Neither: a clear error before any request.
    before = len(grafana.requests)
    out = push(grafana.url, None)
    assert out.returncode == 2 and "set GRAFANA_TOKEN" in out.stderr
    assert len(grafana.requests) == before
