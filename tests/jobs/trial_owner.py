"""A job's rank 0 that runs a tuning trial, as a process of its own (tests/storage/test_storage.py).

    python trial_owner.py URL STUDY hold      start a trial, print its number, hold it until
                                              a line arrives on stdin (a live job)
    python trial_owner.py URL STUDY crash     start a trial, print its number, die (SIGKILL)
    python trial_owner.py URL STUDY sweep     fail the stale trials of STUDY's fingerprint,
                                              as a job that loads its plan does
    python trial_owner.py URL STUDY agent M.. run each mode M in turn as a child (torchrun's
                                              agent: restart count 0, 1, ...)

Under torchrun's variables (TORCHELASTIC_RUN_ID) these are attempts of a torchrun job whose
agent is the process that started them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from autotune.storage import Store


def main(url: str, study_name: str, mode: str, *modes: str) -> None:
    if mode == "agent":
        for restart, child in enumerate(modes):
            env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": str(restart)}
            # The child's stdin and stdout are the agent's: it speaks to the test directly.
            subprocess.run([sys.executable, __file__, url, study_name, child], env=env, check=False)
        return
    store = Store(url)
    _, key, what = study_name.split("/", 2)
    if mode == "sweep":
        store.fail_stale(key)
        return
    study = store.study(key, what)
    trial = study.ask()
    store.started(trial)
    print(trial.number, flush=True)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()


if __name__ == "__main__":
    main(*sys.argv[1:])
