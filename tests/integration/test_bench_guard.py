"""`make bench`'s guard (benchmarks/guard.py) and step_gain's breakdown: the record it compares
with is whole and is what docs/BENCHMARKS.md says, a ratio is flagged where it should be and only
there, and a breakdown takes the slowest rank's step apart. No timing is asserted: the guard
times; these check its arithmetic and its record."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import guard
import step_gain

from autotune.comm.launch import RankFailure, RankResult

ROOT = Path(__file__).resolve().parents[2]


def recorded(autotune: float, low: float, high: float, noop: float = 0.8) -> dict[str, Any]:
    return {
        "autotune": autotune,
        "low": low,
        "high": high,
        "noop": noop,
        "plain_ms": 100.0,
        "headroom_taken": guard.taken(autotune, noop),
        "kept": "the baseline",
        "pairs": 80,
        "locked_at": 300,
    }


def test_the_record_is_whole_and_docs_benchmarks_shows_it() -> None:
    record = json.loads(guard.BASELINE.read_text())
    assert record["commit"] and record["date"] and record["command"]
    assert record["world_size"] == guard.WORLD_SIZE
    assert {"cpu", "cores", "torch", "python"} <= set(record["machine"])
    assert set(record["models"]) == set(guard.MODELS)
    docs = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    # The step-gain table of docs/BENCHMARKS.md is the record's, at its commit.
    assert f"`make bench` at {record['commit']}" in docs
    for model, f in record["models"].items():
        assert f["low"] <= f["autotune"] <= f["high"]
        assert f["headroom_taken"] == pytest.approx(guard.taken(f["autotune"], f["noop"]), abs=1e-3)
        cell = f"**{f['autotune']:.3f}** ({f['low']:.3f}-{f['high']:.3f})"
        row = next((line for line in docs.splitlines() if line.startswith(f"| {model} | ")), "")
        assert cell in row, f"docs/BENCHMARKS.md's {model} row is not the record's {cell}"


def test_a_ratio_is_flagged_beyond_the_recorded_interval_or_above_plain_ddp() -> None:
    before = recorded(0.91, 0.90, 0.92)
    assert guard.verdict(recorded(0.92, 0.91, 0.93), before) is None  # at the upper end
    assert guard.verdict(recorded(0.85, 0.84, 0.86), before) is None  # better
    worse = guard.verdict(recorded(0.95, 0.93, 0.97), before)
    assert worse is not None and "0.950 above its interval's upper end 0.920" in worse
    # Slower than plain DDP beyond noise, with or without a record.
    slower = guard.verdict(recorded(1.03, 1.01, 1.05), None)
    assert slower is not None and "slower than plain DDP" in slower
    assert guard.verdict(recorded(1.003, 0.99, 1.01), None) is None  # noise around 1
    both = guard.verdict(recorded(1.03, 1.01, 1.05), before)
    assert both is not None and "worse than recorded" in both and "slower" in both


def test_headroom_taken_is_the_share_of_noop_hooks_gain() -> None:
    assert guard.taken(0.9, 0.8) == pytest.approx(0.5)
    assert guard.taken(0.8, 0.8) == pytest.approx(1.0)
    assert guard.taken(1.0, 0.8) == pytest.approx(0.0)
    assert math.isnan(guard.taken(0.95, 1.0))


def test_the_table_puts_the_record_beside_each_ratio() -> None:
    now = {"mlp": recorded(0.70, 0.69, 0.71, noop=0.4), "convnet": recorded(1.0, 0.99, 1.01)}
    record = {"commit": "abc1234", "models": {"mlp": recorded(0.66, 0.65, 0.67, noop=0.4)}}
    lines = guard.table(now, record).splitlines()
    assert "recorded (at abc1234)" in lines[0]
    mlp = next(line for line in lines if line.startswith("| mlp |"))
    assert "**0.700** (0.690-0.710)" in mlp and "0.660 (0.650-0.670)" in mlp
    assert "50%" in mlp and "worse than recorded" in mlp
    convnet = next(line for line in lines if line.startswith("| convnet |"))
    assert convnet.endswith("| - | ok |")  # nothing recorded for it


def part(step: float, exposed: float, hook: float, messages: list[Any]) -> dict[str, Any]:
    return {"step": step, "exposed": exposed, "hook": hook, "messages": messages}


def test_a_breakdown_takes_the_slowest_ranks_step_apart() -> None:
    shm, native = (16 << 20, "shm"), (2 << 20, "native")
    rank0 = [
        part(0.100, 0.010, 0.001, [(*native, 0.004, None), (*shm, 0.020, 0.005)]),
        part(0.090, 0.008, 0.001, [(*native, 0.003, None), (*shm, 0.018, 0.004)]),
        part(0.110, 0.012, 0.002, [(*native, 0.005, None), (*shm, 0.022, 0.006)]),
    ]
    rank1 = [  # slower at the second step only
        part(0.095, 0.020, 0.003, [(*native, 0.004, None), (*shm, 0.019, 0.009)]),
        part(0.120, 0.030, 0.003, [(*native, 0.006, None), (*shm, 0.030, 0.020)]),
        part(0.105, 0.020, 0.003, [(*native, 0.004, None), (*shm, 0.020, 0.010)]),
    ]
    noop = [0.080, 0.080, 0.090]
    b = step_gain.breakdown([rank0, rank1], noop)
    assert b["hooked"]
    # The slowest rank per step: rank 0, rank 1, rank 0.
    assert b["step_ms"] == pytest.approx(110.0)  # median of 100, 120, 110
    assert b["exposed_ms"] == pytest.approx(12.0)  # of 10, 30, 12
    assert b["hook_ms"] == pytest.approx(2.0)  # of 1, 3, 2
    # Step less exposed, over noop's: 10, 10, 8.
    assert b["backward_over_noop_ms"] == pytest.approx(10.0)
    by = {(m["class"], m["algorithm"]): m for m in b["messages"]}
    assert by[shm]["ms"] == pytest.approx(22.0) and by[shm]["waiting_ms"] == pytest.approx(6.0)
    assert by[shm]["per_step"] == 1
    assert by[native]["ms"] == pytest.approx(5.0) and by[native]["waiting_ms"] is None


def test_a_step_without_the_hook_has_nothing_to_take_apart() -> None:
    assert step_gain.breakdown([None, None], [0.1]) == {"hooked": False}
    rows = [
        {"model": "convnet", "world_size": 4, "plain_ms": 230.0, "breakdown": {"hooked": False}},
        {
            "model": "mlp",
            "world_size": 4,
            "plain_ms": 34.0,
            "breakdown": {
                "hooked": True,
                "plain_ms": 34.0,
                "noop_ms": 14.0,
                "step_ms": 22.0,
                "backward_over_noop_ms": 3.0,
                "hook_ms": 0.5,
                "exposed_ms": 5.0,
                "cpu_ms": {"plain": 13.0, "noop": 7.5, "autotune": 10.5},
                "cores": 2,
                "idle_ms": {"plain": 6.5, "noop": 0.8, "autotune": 4.9},
                "messages": [
                    {
                        "class": 4 << 20,
                        "algorithm": "shm",
                        "per_step": 1.0,
                        "ms": 6.0,
                        "waiting_ms": 1.5,
                    }
                ],
            },
        },
    ]
    table = step_gain.breakdown_markdown(rows).splitlines()
    assert "unhooked" in table[2]
    assert table[3] == (
        "| mlp | 4 | 34.0 | 14.0 | 22.0 | 60% | 3.0 (0.5) | 5.0 | 1 x 4 MiB `shm` 6.0 (1.5) "
        "| 13.0 / 7.5 / 10.5 | 6.0 (2 cores) | 6.5 / 0.8 / 4.9 |"
    )


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the cores' idle time is Linux's")
def test_the_cores_idle_time_is_read_in_seconds_and_only_grows() -> None:
    first = step_gain.idle_seconds()
    second = step_gain.idle_seconds()
    assert first is not None and second is not None
    # Since boot, all cores together: not more than the cores' wall time since boot.
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    assert 0 < first <= second <= (up + 1) * (os.cpu_count() or 1)


def test_cpu_beyond_noop_is_spread_over_the_cores_the_ranks_share() -> None:
    cpu = {"plain": 13.0, "noop": 7.5, "autotune": 10.5}  # ms a step, a rank's process
    # 4 ranks on 2 cores: each core runs two ranks' extra 3 ms.
    assert step_gain.beyond_noop_on_cores(cpu, ranks=4, cores=2) == pytest.approx(6.0)
    # A core each: a rank's extra work is on its own core's timeline alone.
    assert step_gain.beyond_noop_on_cores(cpu, ranks=4, cores=16) == pytest.approx(3.0)


@pytest.mark.parametrize(("name", "megabytes"), [("lstm", 12.4), ("thin", 3.1)])
def test_the_held_out_models_take_a_step(name: str, megabytes: float) -> None:
    # The shapes no change is tuned against (step_gain.HELD_OUT): their batches fit their
    # models, a step's loss is finite, and their gradients are the sizes docs/BENCHMARKS.md says.
    model, batch = step_gain._model_and_batch(name, 0)
    x, y = batch(torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.numel() * 4 for g in grads if g is not None) / 1e6 == pytest.approx(
        megabytes, abs=0.05
    )


def row(model: str, autotune: float) -> dict[str, Any]:
    """What step_gain.cell returns, as far as the guard reads it."""
    ratio = {"median": autotune, "low": autotune - 0.01, "high": autotune + 0.01, "n": 80}
    return {
        "model": model,
        "world_size": 4,
        "plain_ms": 100.0,
        "noop": {"median": 0.8, "low": 0.79, "high": 0.81, "n": 80},
        "autotune": ratio,
        "restart_plan": "the plan",
        "locked_at": 300,
        "breakdown": None,
    }


def run_guard(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ratios: Mapping[str, float | None], *args: str
) -> tuple[int, Path]:
    """guard.main on ranks played by ``ratios`` (None: that model's ranks fail)."""

    def cell(model: str, world_size: int, options: Any) -> dict[str, Any]:
        ratio = ratios[model]
        if ratio is None:
            raise RankFailure([RankResult(1, error="killed", exitcode=-9, failed_at=1.0)])
        return row(model, ratio)

    monkeypatch.setattr(step_gain, "cell", cell)
    monkeypatch.setattr(step_gain, "kept", lambda plan: "16 MiB: shm")
    baseline = tmp_path / "baseline.json"
    models = ",".join(ratios)
    return guard.main(["--baseline", str(baseline), "--models", models, *args]), baseline


def test_the_guard_records_every_model_or_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    everything = dict.fromkeys(guard.MODELS, 0.9)
    code, baseline = run_guard(monkeypatch, tmp_path, {**everything, "convnet": None}, "--record")
    assert code == 1 and not baseline.exists()  # a model failed
    code, baseline = run_guard(monkeypatch, tmp_path, {"mlp": 0.9}, "--record")
    assert code == 1 and not baseline.exists()  # not every model
    code, baseline = run_guard(monkeypatch, tmp_path, everything, "--record")
    assert code == 0
    record = json.loads(baseline.read_text())
    assert set(record["models"]) == set(guard.MODELS)
    assert record["models"]["mlp"]["autotune"] == 0.9 and record["models"]["mlp"]["high"] == 0.91
    assert record["machine"]["cores"] == os.cpu_count()


def test_the_guard_fails_on_a_ratio_worse_than_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    everything = dict.fromkeys(guard.MODELS, 0.9)
    assert run_guard(monkeypatch, tmp_path, everything, "--record")[0] == 0
    # Within the recorded interval (0.89-0.91): passes; above it: flagged.
    assert run_guard(monkeypatch, tmp_path, {**everything, "mlp": 0.905})[0] == 0
    assert run_guard(monkeypatch, tmp_path, {**everything, "transformer": 0.95})[0] == 1
    assert "flagged: transformer" in capsys.readouterr().out
    # A model that fails fails the guard too, and the others still run.
    assert run_guard(monkeypatch, tmp_path, {**everything, "mlp": None})[0] == 1
    out = capsys.readouterr().out
    assert "failed: mlp" in out and "| transformer |" in out


def test_the_guard_keeps_rank_0s_log_of_each_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where a model kept less than before, its screening values and paired tests say why: the
    guard hands step_gain a directory for rank 0's autotune log of runs 1 and 2, and each run
    writes its own file there, INFO up."""
    import logging

    given: list[str] = []

    def cell(model: str, world_size: int, options: Any) -> dict[str, Any]:
        given.append(options.log_dir)
        return row(model, 0.9)

    monkeypatch.setattr(step_gain, "cell", cell)
    monkeypatch.setattr(step_gain, "kept", lambda plan: "16 MiB: shm")
    logs = tmp_path / "logs"
    args = ["--baseline", str(tmp_path / "b.json"), "--models", "mlp", "--log-dir", str(logs)]
    guard.main(args)
    assert given == [str(logs)]
    assert f"rank 0's autotune logs of runs 1 and 2: {logs}/" in capsys.readouterr().out
    assert guard.LOGS == ROOT / "bench-logs"  # the default, git-ignored
    assert "/bench-logs/" in (ROOT / ".gitignore").read_text().splitlines()

    # What a run does with it (`step_gain.alone` on rank 0): autotune's INFO records, in a file
    # named for the model, the world size and the run.
    log = logging.getLogger("autotune")
    level, handlers = log.level, list(log.handlers)
    try:
        step_gain._log_to(logs / "mlp-x4-tune.log")
        log.info("autotune screening, 4 MiB class: shm 1.00 ms")
        log.debug("not kept")
    finally:
        for h in log.handlers[len(handlers) :]:
            h.close()
            log.removeHandler(h)
        log.setLevel(level)
    text = (logs / "mlp-x4-tune.log").read_text()
    assert "autotune screening, 4 MiB class: shm 1.00 ms" in text and "not kept" not in text
