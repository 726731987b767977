"""Elastic restarts under torchrun for real (2 ranks, gloo on 127.0.0.1, ``--max-restarts 2``):
a restarted worker group fails the dead attempt's trials at once and picks the tuned plan back
up from storage. The job and its three attempts: tests/jobs/elastic_job.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest
from elastic_job import EXPLORE_BY
from optuna.trial import TrialState

JOB = str(Path(__file__).parents[1] / "jobs" / "elastic_job.py")
QUICK = {  # a budget that locks in tens of steps
    "AUTOTUNE_ALGORITHMS": "native,ring",
    "AUTOTUNE_TUNE_SAMPLES": "1",
    "AUTOTUNE_TUNE_TRIALS": "2",
    "AUTOTUNE_MAX_PAIRS": "6",
    "AUTOTUNE_TUNE_WARMUP": "0",
    "AUTOTUNE_FUSION_BYTES": "0",
}


@pytest.mark.distributed
def test_a_restarted_worker_group_fails_the_dead_attempts_trials_and_starts_locked(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'plans.db'}"
    env = {
        **os.environ,
        **QUICK,
        "AUTOTUNE_STORAGE": storage,
        "GLOO_SOCKET_IFNAME": "lo",
        # torch 2.13's agent keeps one store across attempts, with the last attempt's keys in
        # it: process groups of a restarted attempt then connect to dead peers (docs/FAULTS.md).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "--max-restarts=2", f"--log-dir={tmp_path / 'logs'}", JOB, str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"attempt{k}.json").read_text()) for k in range(3)]
    # Attempt 0 died exploring, with a trial running; attempt 1 tuned on until locked.
    assert seen[0]["running"] >= 1 and seen[0]["died_at"] < EXPLORE_BY
    assert seen[0]["settled_at"] is None
    assert seen[1]["settled_at"] is not None and seen[1]["running"] == 0
    # Attempt 2 found the plan attempt 1 locked: locked within its first exchanges (after one
    # confirm paired test of 6-12 pairs of iterations where attempt 1 locked ring for a class, as it
    # may on a busy machine), no trial of its own, and trained to the end with every rank's
    # parameters identical.
    assert seen[2]["settled_at"] < 10 + 2 * 2 * int(QUICK["AUTOTUNE_MAX_PAIRS"])
    assert seen[2]["states"] == ["locked"] and seen[2]["identical"]
    trials = [
        t
        for s in optuna.get_all_study_summaries(storage)
        for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials()
    ]
    by_attempt = {
        k: [t for t in trials if t.user_attrs.get("elastic_attempt") == k] for k in (0, 1, 2)
    }
    assert by_attempt[2] == []
    # The trials attempt 0 left running were failed by attempt 1, at once (not 90 s later, when
    # their heartbeat would have gone stale), saying why.
    failed = [
        t for t in by_attempt[0] if "its workers restarted" in str(t.user_attrs.get("failure"))
    ]
    assert len(failed) == seen[0]["running"]
    assert all(t.state == TrialState.FAIL for t in failed)
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_a_restart_on_the_agents_shared_store_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.setup_checks import warn_restart_on_shared_store

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_restart_on_shared_store()  # a first attempt: nothing stale
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.warns(UserWarning, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        warn_restart_on_shared_store()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_restart_on_shared_store()
