"""The command line's own manners: ``--version``, and no torch imported by what needs none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune import __version__


def imports(*args: str) -> tuple[str, set[str]]:
    """What ``python -m autotune.cli ARGS`` printed, and the top-level modules it imported."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "autotune.cli", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    modules = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    return out.stdout, modules


def test_version_is_the_packages() -> None:
    stdout, modules = imports("--version")
    assert stdout.strip() == f"autotune {__version__}"
    assert "torch" not in modules


@pytest.mark.parametrize("args", [("--help",), ("daemon", "--help"), ("show", "--help")])
def test_help_imports_no_torch(args: tuple[str, ...]) -> None:
    stdout, modules = imports(*args)
    assert "usage: autotune" in stdout
    assert "torch" not in modules and "autotune" in modules


def test_a_commands_own_help_still_has_its_options() -> None:
    stdout, _ = imports("sweep", "--help")
    assert "--world-size" in stdout and "-b MINBYTES" in stdout
    stdout, _ = imports("model", "--help")
    assert "--algorithms" in stdout


def test_the_public_names_load_on_first_use() -> None:
    code = (
        "import sys, autotune; before = 'torch' in sys.modules; h = autotune.hook; "
        "print(before, 'torch' in sys.modules, callable(h), h.__module__, "
        "autotune.Config.__name__, autotune.algorithms.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "False", "True", "True", "autotune.comm_hook", "Config", "autotune.algorithms",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "nccl_cell", "shm"),
    [
        (("gloo/cpu",), "no: needs nccl/cuda", "gloo/cpu"),
        (("gloo/cpu", "gloo/cuda", "nccl/cuda"), "nccl/cuda", "gloo/cpu"),
        ((), "no: needs nccl/cuda", "no: needs gloo/cpu"),
    ],
)
def test_algorithms_says_what_runs_on_this_machine(
    machine: tuple[str, ...],
    nccl_cell: str,
    shm: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import autotune.cli
    from autotune.algorithms import available

    monkeypatch.setattr(autotune.cli, "here", lambda: machine)
    assert autotune.cli.main(["algorithms", "--all"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert nccl_cell in rows["nccl.ring.ll128"] and shm in rows["shm"]
    assert ", ".join(machine) in rows["ring"] if machine else "no: needs" in rows["ring"]
    # Without --all, NCCL's cells are one row where none can run here (24 rows hid the rest).
    assert autotune.cli.main(["algorithms"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line}
    cells = [a for a in available() if a.startswith("nccl.")]
    if "nccl/cuda" in machine:
        assert "nccl.ring.ll128" in rows and "nccl.*" not in rows and "--all" not in out
    else:
        assert "nccl.ring.ll128" not in rows and f"nccl.* ({len(cells)})" in rows["nccl.*"]
        assert nccl_cell in rows["nccl.*"] and "--all lists them" in out


@pytest.mark.parametrize("args", [["results.json"], ["--prometheus", "http://127.0.0.1:9"]])
def test_report_without_matplotlib_says_what_to_install(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It ended in a traceback.
    import autotune.cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    assert autotune.cli.main(["report", *args]) == 2
    err = capsys.readouterr().err
    assert "matplotlib, which is not installed here: pip install 'autotune[report]'" in err
