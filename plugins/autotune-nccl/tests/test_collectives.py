"""The per-collective sums, NCCL's model error and the regret of its choice: records played
through the profiler's C ABI, predictions through the tuner's, joined in autotune_nccl.collectives
and served by autotune's collector (checked by prometheus_client's parser, and promtool's where
Prometheus is installed)."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from nccl_jobs import exported_on_fake_nccl
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autotune.comm.launch import run_local
from autotune.comm.nccl_feed import NcclFeed, PluginLibrary, nccl_source
from autotune.metrics import NcclMetrics
from autotune_nccl import Profiler, Tuner, library_path
from autotune_nccl.collectives import Collectives, bus_factor, size_class
from autotune_nccl.played.profiler import SYMMETRIC_PHASES, ProfiledComm
from autotune_nccl.played.tuner import LL, RING, SIMPLE, TREE, NcclComm, nccl_table, v6


@pytest.fixture
def plugins() -> Iterator[tuple[Profiler, Tuner]]:
    p, t = Profiler(), Tuner()
    for clear in (p.reclaim, p.drain, t.clear_predictions, t.disarm):
        clear()
    t.load_table(None)
    yield p, t
    for clear in (p.reclaim, p.drain, t.clear_predictions, t.disarm):
        clear()


def scrape(
    metrics: NcclMetrics,
) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """The exposition a scrape of ``metrics`` gets, and its samples by (name, labels)."""
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    return text, got


def promtool_accepts(text: str) -> None:
    """Prometheus's own check of an exposition, where promtool is installed."""
    promtool = shutil.which("promtool")
    if promtool is not None:
        out = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stdout + out.stderr


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("AllReduce", 4) == 1.5 and bus_factor("AllReduce", 1) == 1.0
    assert bus_factor("AllGather", 4) == 3.0 and bus_factor("Broadcast", 8) == 1.0
    assert size_class(1 << 20) == 1 << 20 and size_class((1 << 20) + 1) == 2 << 20


def play_step(comm: ProfiledComm, tuner_comm: NcclComm, tuner: Tuner, cell: tuple[str, str],
              kernel_ns: int) -> None:  # fmt: skip
    """One all-reduce of 1 MiB: NCCL asks the tuner (which steers it to ``cell`` unless None),
    then runs it on 2 channels that take ``kernel_ns`` first start to last stop."""
    table = nccl_table()
    table[TREE][LL] = 5.0  # NCCL's model: tree/LL is the cheapest, 5 us (nccl_table: the rest)
    tuner.arm(*cell)
    tuner_comm.coll_info(1 << 20, table)
    algo, proto = cell[0].upper(), cell[1].upper()
    timers = [(1_000, kernel_ns + 995), (1_005, kernel_ns + 1_000)]
    comm.collective("AllReduce", 1 << 18, timers=timers, algo=algo, proto=proto)


def test_model_error_and_regret_from_played_nccl(plugins: tuple[Profiler, Tuner]) -> None:
    profiler, tuner = plugins
    dropped_before = profiler.stats().ring_full  # the library's counters are the process's
    comm = ProfiledComm("v6", comm_id=0x77, nranks=4)
    tuner_comm = NcclComm(v6(), comm_id=0x77, ranks=4)
    # NCCL's own choice (tree/LL, 5 us in its model) takes 200 us; ring/Simple (its model:
    # 15 us) 100 us.
    for _ in range(3):
        play_step(comm, tuner_comm, tuner, ("tree", "LL"), 200_000)
        play_step(comm, tuner_comm, tuner, ("ring", "Simple"), 100_000)
    feed = NcclFeed(PluginLibrary())
    metrics = NcclMetrics(feed, {"rank": "0"})
    text, got = scrape(metrics)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted({"rank": "0", **labels}.items())))]

    ring = {"collective": "AllReduce", "size_class": str(1 << 20), "algorithm": "ring",
            "protocol": "Simple"}  # fmt: skip
    tree = {**ring, "algorithm": "tree", "protocol": "LL"}
    assert value("autotune_nccl_collective_seconds_count", **ring) == 3
    assert value("autotune_nccl_collective_seconds_sum", **ring) == pytest.approx(3e-4)
    assert value("autotune_nccl_collective_bytes_total", **ring) == 3 << 20
    assert value("autotune_nccl_busbw_bytes_per_second", **ring) == pytest.approx(
        (1 << 20) * 1.5 / 1e-4
    )
    ring_predicted_us = 10.0 + RING * 3 + SIMPLE
    assert value("autotune_nccl_model_error_ratio", **ring) == pytest.approx(
        ring_predicted_us / 100.0
    )
    assert value("autotune_nccl_model_error_ratio", **tree) == pytest.approx(5.0 / 200.0)
    assert value("autotune_nccl_predicted_seconds_total", **tree) == pytest.approx(3 * 5e-6)
    # NCCL chose tree/LL (its cheapest prediction); the best measured is ring/Simple: 2x.
    assert value(
        "autotune_nccl_choice_regret_ratio", collective="AllReduce", size_class=str(1 << 20),
        nccl_choice="tree/LL", best="ring/Simple",
    ) == pytest.approx(2.0)  # fmt: skip
    assert value("autotune_nccl_profiler_info", version="6") == 1
    assert value("autotune_nccl_profiler_records_total", clock="gpu") == 6
    assert value("autotune_nccl_profiler_lost_total", reason="ring_full") == dropped_before
    promtool_accepts(text)
    metrics.close()
    feed.close()
    comm.finalize()
    tuner_comm.close()


def test_without_a_prediction_there_is_no_model_error_and_no_regret(
    plugins: tuple[Profiler, Tuner],
) -> None:
    profiler, _ = plugins
    comm = ProfiledComm("v4", comm_id=0x78, nranks=2)  # NCCL 2.27, no tuner plugin
    for ns in (10_000, 20_000, 30_000):
        comm.collective("AllGather", 1000, timers=[(1, ns + 1)], algo="RING", proto="LL")
    c = Collectives()
    assert c.add(profiler.drain()) == 3
    [(key, cell)] = c.cells.items()
    assert key == ("AllGather", 4096, "ring", "LL")
    assert cell.joined == 0 and cell.model_error is None and c.regret() == {}
    assert cell.busbw == pytest.approx(3 * 4000 * 1.0 / 60e-6)  # (n-1) x bytes over the time
    comm.finalize()


def test_a_gather_joins_nccls_bytes_which_count_every_rank(
    plugins: tuple[Profiler, Tuner],
) -> None:
    profiler, tuner = plugins
    comm = ProfiledComm("v6", comm_id=0x79, nranks=4)
    tuner_comm = NcclComm(v6(), comm_id=0x79, ranks=4)
    tuner_comm.coll_info(4 * 4096, func=2)  # NCCL asks about the gathered 16 KiB
    comm.collective("AllGather", 1024, timers=[(1, 40_001)], algo="RING", proto="SIMPLE")
    c = Collectives()
    c.add(profiler.drain(), tuner.predictions()[0])
    cell = c.cells[("AllGather", 4096, "ring", "Simple")]
    assert cell.joined == 1 and cell.predicted_s == pytest.approx((10 + RING * 3 + SIMPLE) / 1e6)
    comm.finalize()
    tuner_comm.close()


def test_the_exporter_reads_the_library_only_where_nccl_was_told_to_load_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NCCL_PROFILER_PLUGIN", raising=False)
    assert nccl_source() is None
    monkeypatch.setenv("NCCL_PROFILER_PLUGIN", "/opt/nccl/libnccl-profiler-inspector.so")
    assert nccl_source() is None  # someone else's profiler
    monkeypatch.setenv("NCCL_PROFILER_PLUGIN", library_path())
    assert nccl_source() is not None
    assert Profiler().environ() == {
        "NCCL_PROFILER_PLUGIN": library_path(), "NCCL_TUNER_PLUGIN": library_path(),
    }  # fmt: skip


def test_the_feed_hands_every_batch_to_each_reader_on_a_daemon_thread_that_stops(
    plugins: tuple[Profiler, Tuner],
) -> None:
    feed = NcclFeed(PluginLibrary(), interval_s=0.01)
    metrics = NcclMetrics(feed)
    seen: list[int] = []
    feed.subscribe(lambda records: seen.extend(r.seq for r in records))
    comm = ProfiledComm("v5", comm_id=0x80)
    for _ in range(3):
        comm.collective("AllReduce", 256)
    thread = feed._thread
    assert thread is not None and thread.daemon
    feed.close()
    assert not thread.is_alive()
    assert seen == [0, 1, 2]  # in order, each once, whichever thread drained it
    assert sum(c.count for c in metrics.collectives.cells.values()) == 3
    comm.finalize()


@pytest.mark.distributed
def test_a_job_on_a_played_nccl_exports_every_collective(tmp_path: Path) -> None:
    # 2 gloo ranks, the hook and the exporter on; each rank's "NCCL" asks the tuner plugin and
    # reports every all-reduce to the profiler plugin through their C ABIs, as NCCL 2.30 does.
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    # The ranks end with os._exit (the launcher's): their node files stay in tmp_path, not /dev/shm.
    env = {"AUTOTUNE_NCCL_SHM_DIR": str(tmp_path)}
    got = run_local(exported_on_fake_nccl, 2, storage, 12, timeout_s=300, env=env)
    for rank, r in enumerate(got):
        families = {f.name: f for f in text_string_to_metric_families(r["text"])}
        count: Counter[tuple[str, str]] = Counter()
        for s in families["autotune_nccl_collective_seconds"].samples:
            if s.name.endswith("_count"):  # one series per size class: summed per cell
                count[(s.labels["algorithm"], s.labels["protocol"])] += int(s.value)
        ran = Counter((a, p) for a, p in r["calls"])
        assert count == ran and sum(ran.values()) >= 12, rank
        # Every run joined NCCL's prediction (same communicator, size): a model error per cell.
        errors = families["autotune_nccl_model_error_ratio"].samples
        assert {(s.labels["algorithm"], s.labels["protocol"]) for s in errors} == set(ran)
        assert all(s.value > 0 for s in errors)
        info = families["autotune_nccl_profiler_info"].samples
        assert [(s.labels["version"], s.value) for s in info] == [("6", 1.0)]
        if shutil.which("promtool") is not None:
            out = subprocess.run(
                ["promtool", "check", "metrics"], input=r["text"], capture_output=True, text=True
            )
            assert out.returncode == 0, out.stdout + out.stderr


def test_v7s_variant_symmetric_flag_phases_and_the_profilers_cost_are_series(
    plugins: tuple[Profiler, Tuner],
) -> None:
    del plugins  # the fixture: a clean profiler and tuner
    comm = ProfiledComm("v7", comm_id=0x79, nranks=4)
    for _ in range(2):
        comm.collective(
            "AllReduce", 1 << 18, phases=SYMMETRIC_PHASES, variant="sym_ld", symmetric=True
        )
    comm.collective("AllReduce", 1 << 18, variant="ring_ll", symmetric=False, algo="RING")
    feed = NcclFeed(PluginLibrary())
    metrics = NcclMetrics(feed, {"rank": "0"})
    text, got = scrape(metrics)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted({"rank": "0", **labels}.items())))]

    cell = {"collective": "AllReduce", "size_class": str(1 << 20), "algorithm": "ring",
            "protocol": "Simple"}  # fmt: skip
    name = "autotune_nccl_kernel_variant_collectives_total"
    assert value(name, **cell, kernel_variant="sym_ld", symmetric="true") == 2
    assert value(name, **cell, kernel_variant="ring_ll", symmetric="false") == 1
    phase = {"collective": "AllReduce", "size_class": str(1 << 20), "kernel_variant": "sym_ld"}
    for p, ns in (("initial_sync", 2_000), ("compute", 41_000), ("final_sync", 11_000)):
        assert value("autotune_nccl_kernel_phase_seconds_count", **phase, phase=p) == 2
        assert value("autotune_nccl_kernel_phase_seconds_sum", **phase, phase=p) == (
            pytest.approx(2 * ns / 1e9)
        )
    assert not any(k[0].startswith("autotune_nccl_kernel_phase") and "ring_ll" in str(k)
                   for k in got)  # fmt: skip
    assert value("autotune_nccl_profiler_cost_seconds_count") == 1  # the first of 16 is timed
    assert 0 < value("autotune_nccl_profiler_cost_seconds_sum") < 1.0
    assert value("autotune_nccl_profiler_chain_calls_total", result="forwarded") == 0
    assert value("autotune_nccl_profiler_sampled_out_total") == 0
    promtool_accepts(text)
    metrics.close()
    feed.close()
    comm.finalize()
