"""The tuned table: stored, shown, exported as JSON and as NCCL tuner CSV, loaded back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.plan import Arm, Buckets, Choice, Entry, Gain, NearMiss, Table, load_table
from autotune.storage import SWEEP, Store, fingerprint, fingerprint_key

FP = fingerprint(backend="nccl", world_size=16, nodes=2, device="NVIDIA H100", dtype="bfloat16")
TABLE = Table(
    {
        64 << 10: Entry(Choice("tree"), 0.00021, 4, "locked"),
        1 << 20: Entry(Choice("two_tree", 256 << 10), 0.0011, 10, "locked"),
        16 << 20: Entry(Choice("ring", 4 << 20), 0.0098, 10, "locked"),
        256 << 20: Entry(Choice("native"), 0.12, 10, "locked"),
    },
    fusion_bytes=4 << 20,
    fingerprint=FP,
)


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(TABLE.to_json()))
    assert load_table(str(path)) == TABLE


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "is not JSON"),
        ('{"classes": {"1000": {"algorithm": "ring"}}}', "powers of two"),
        ('{"classes": {"1024": {}}}', "class '1024': KeyError"),
        ('{"classes": {"1024": {"algorithm": "ring", "segment_bytes": "big"}}}', "class '1024'"),
        (
            '{"classes": {"1024": {"algorithm": "ring", "segment_bytes": -1}}}',
            "segment_bytes: must be at least 4096",
        ),
        ('{"classes": {"1024": {"algorithm": "rign"}}}', "unknown algorithm 'rign'"),
        ('{"classes": {"1024": {"algorithm": "ring", "state": "sure"}}}', "state must be one of"),
        ('{"classes": {"1024": {"algorithm": "ring", "trials": -2}}}', "trials must be"),
        ('{"classes": {"1024": {"algorithm": "ring", "best_s": -1}}}', "best_s must be"),
        ('{"classes": {"0": {"algorithm": "ring"}}}', "powers of two"),
        # A negative fusion size once turned the all-reduce off: ranks trained apart, exit 0.
        ('{"classes": {}, "fusion_bytes": -64}', "fusion_bytes: must be 0 .* at least 4096"),
        ('{"classes": {}, "fusion_bytes": 3}', "fusion_bytes: must be 0 .* at least 4096"),
        ('{"classes": {}, "fusion_bytes": "4M"}', "fusion_bytes: expected an int"),
        ("[]", "a JSON object with a 'classes' object"),
    ],
)
def test_bad_plan_files_say_what_is_wrong(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=words) as raised:
        load_table(str(path))
    assert str(path) in str(raised.value)  # the file is named


def test_missing_plan_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read plan file"):
        load_table(str(tmp_path / "nope.json"))


def test_nccl_csv() -> None:
    lines = TABLE.nccl_csv(n_nodes=2, n_ranks=16).splitlines()
    rows = [line for line in lines if not line.startswith("#")]
    assert rows == [
        "allreduce,32769,65536,tree,ll,-1,2,16,-1,-1",
        "allreduce,524289,1048576,tree,simple,-1,2,16,-1,-1",  # two_tree is NCCL's tree
        "allreduce,8388609,16777216,ring,simple,-1,2,16,-1,-1",
    ]
    # Every row has the plugin's ten columns; native has no NCCL counterpart and is said so.
    assert all(len(r.split(",")) == 10 for r in rows)
    assert any("left to NCCL" in line and "native" in line for line in lines)


def test_show_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    key = fingerprint_key(FP)
    Store(url).save_table(key, "bert", TABLE)
    assert main(["show", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert f"plan {key}/bert: backend=nccl, world_size=16, nodes=2" in out
    # The lines under the header are the table's own (`print(state.table())` reads the same);
    # a segment is "-" where the algorithm has none, as every other plan table says it.
    assert "\n".join(f"  {line}" for line in str(TABLE).splitlines()) in out
    assert str(TABLE).splitlines() == [
        "fusion: 4 MiB; step: not compared with plain DDP, final",
        "size class algorithm    segment  median (us) trials state",
        "    64 KiB tree         default        210.0      4 locked",
        "     1 MiB two_tree     256 KiB       1100.0     10 locked",
        "    16 MiB ring           4 MiB       9800.0     10 locked",
        "   256 MiB native             -     120000.0     10 locked",
    ]
    json_path, csv_path = tmp_path / "p.json", tmp_path / "p.csv"
    assert (
        main(["show", "--storage", url, "--json", str(json_path), "--nccl-csv", str(csv_path)]) == 0
    )
    assert load_table(str(json_path)) == TABLE
    assert csv_path.read_text() == TABLE.nccl_csv(2, 16)
    assert csv_path.read_text().endswith(": native\n")  # a final newline, as tools expect
    assert "tests it again" not in out  # TABLE has no lead


def test_show_names_a_stored_lead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"

    def shown(lead: NearMiss, final: bool = True) -> str:
        """What ``autotune show`` prints of a table with ``lead``, stored and read back."""
        table = Table(TABLE.classes, 0, FP, None, lead, final=final)
        Store(url).save_table("aaa", "bert", table)
        assert Store(url).load_table("aaa", "bert") == table
        assert main(["show", "--storage", url]) == 0
        return capsys.readouterr().out

    lead = NearMiss(Arm(((1 << 20, Choice("tree")),), 16 << 20), Gain(0.953, 0.9, 1.02, 24))
    assert (
        "ahead but not beyond noise; the next job tests it again: 1 MiB: tree, fusion 16 MiB "
        "(0.95x over 24 pairs)"
    ) in shown(lead)
    # A provisional table's lead is its fusion size that came close, met again with algorithms.
    near = NearMiss(Arm((), 4 << 20), Gain(0.96, 0.9, 1.02, 16))
    assert (
        "the next job tests it again, with the plan's algorithms carried to it: fusion 4 MiB "
        "(0.96x over 16 pairs)"
    ) in shown(near, final=False)
    # A plan that beat the baseline and lost only to a plan that then lost the check against
    # plain DDP says so, and survives the storage's JSON as such.
    shm = Arm(((1 << 20, Choice("shm")),), 0)
    beaten = NearMiss(shm, Gain(0.91, 0.85, 0.97, 10), "beaten")
    out = shown(beaten)
    assert (
        "beat the baseline, then lost to a plan that lost the check against plain DDP; the next "
        "job tests it again: 1 MiB: shm (0.91x over 10 pairs)"
    ) in out
    assert "ahead but not beyond noise" not in out
    # A plan that lost the check itself, ahead on the median: its gain is over pairs of blocks.
    assert (
        "ahead of plain DDP at the check, but not beyond noise; the next job tests it again: "
        "1 MiB: shm (0.95x over 24 pairs of blocks)"
    ) in shown(NearMiss(shm, Gain(0.95, 0.9, 1.01, 24), "checked"))
    with pytest.raises(ValueError, match="kind must be one of near, beaten"):
        NearMiss.from_json({**beaten.to_json(), "kind": "won"})
    assert NearMiss.from_json(lead.to_json()) == lead  # a lead stored before kinds: "near"
    assert "kind" not in lead.to_json()


def test_show_names_the_bucket_size_a_job_stepped_aside_onto(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    native = {cls: Entry(Choice("native"), None, 3, "locked") for cls in TABLE.classes}
    kept = Buckets(16 << 20, Gain(0.81, 0.7, 0.9, 8))
    Store(url).save_table("aaa", "bert", Table(native, 0, FP, None, None, kept))
    assert main(["show", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "unhooked onto DDP's buckets at 16 MiB (0.81x over 8 pairs of blocks)" in out
    assert "; step: 0.81x plain DDP's (8 pairs, 95% interval 0.70-0.90x), final" in out


def test_show_wants_a_key_when_exporting_one_of_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    store = Store(url)
    store.save_table("aaa", "bert", TABLE)
    store.save_table("bbb", "bert", TABLE)
    store.save_table("bbb", "gpt", TABLE)
    store.save_table("bbb", SWEEP, Table(TABLE.classes, None, FP))
    assert main(["show", "--storage", url, "--json", str(tmp_path / "p.json")]) == 2
    assert "pick one with --key" in capsys.readouterr().err
    assert main(["show", "--storage", url, "--key", "ccc"]) == 2
    assert "no plan 'ccc'" in capsys.readouterr().err
    # A fingerprint key alone shows every workload's plan under it...
    assert main(["show", "--storage", url, "--key", "bbb"]) == 0
    out = capsys.readouterr().out
    assert "plan bbb/bert:" in out and "plan bbb/gpt:" in out and "plan aaa/" not in out
    assert "plan bbb/sweep (a sweep's screening: seeds every job's search)" in out
    # ... and exports none of them: KEY/WORKLOAD picks one.
    export = ["show", "--storage", url, "--json", str(tmp_path / "p.json")]
    assert main([*export, "--key", "bbb"]) == 2
    assert "bbb/bert, bbb/gpt, bbb/sweep" in capsys.readouterr().err
    assert main([*export, "--key", "bbb/gpt"]) == 0


def test_show_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).tables()  # an empty storage, as a job leaves one that has stored nothing yet
    assert main(["show", "--storage", url]) == 0
    assert "no tuned plans" in capsys.readouterr().out


def test_a_table_keeps_the_model_and_whether_it_was_final_and_old_tables_load() -> None:
    described = Table(TABLE.classes, 0, FP, Gain(0.9, 0.85, 0.95, 12), model="Net, 9 parameters")
    provisional = Table(TABLE.classes, 0, FP, None, model="Net, 9 parameters", final=False)
    for table in (described, provisional):
        assert Table.from_json(json.loads(json.dumps(table.to_json()))) == table
    # Written before either existed: no model, final (only decided plans were stored).
    old = TABLE.to_json()
    assert "model" not in old and "final" not in old
    assert Table.from_json(old).model is None and Table.from_json(old).final
    with pytest.raises(ValueError, match="final: expected true or false"):
        Table.from_json({**old, "final": "no"})


MIB = 1 << 20


def test_a_provisional_table_keeps_the_fusion_sizes_its_job_left() -> None:
    mib = MIB
    left = Table(TABLE.classes, 0, FP, None, final=False, fusion_left=(4 * mib, 16 * mib))
    raw = json.loads(json.dumps(left.to_json()))
    assert raw["fusion_left"] == [4 * mib, 16 * mib]
    assert Table.from_json(raw) == left
    assert left.lines()[0] == (
        "fusion: DDP's buckets so far (4 MiB, 16 MiB still to meet the plan); step: not compared "
        "with plain DDP, provisional: the next job resumes from it"
    )
    # A long name widens its column rather than pushing the rest out of line.
    wide = Table({MIB: Entry(Choice("hierarchical_two_tree"), 2e-3, 3, "locked")}, 0, FP)
    assert wide.lines()[1:] == [
        "size class algorithm               segment  median (us) trials state",
        "     1 MiB hierarchical_two_tree   default       2000.0      3 locked",
    ]
    # A provisional table stored before it existed: none left (its job had met them first).
    del raw["fusion_left"]
    assert Table.from_json(raw).fusion_left == ()
    for bad in ("4M", [-1], [True]):
        with pytest.raises(ValueError, match="fusion_left"):
            Table.from_json({**raw, "fusion_left": bad})
    # Its plan's estimate (the next job's check takes its block size from it); none stored by a
    # final table, nor where not known.
    rated = dataclasses.replace(left, estimate=0.66)
    raw = json.loads(json.dumps(rated.to_json()))
    assert raw["estimate"] == 0.66 and Table.from_json(raw) == rated
    assert "estimate" not in left.to_json() and Table.from_json(left.to_json()).estimate is None
    assert "estimate" not in dataclasses.replace(rated, final=True).to_json()
    for wrong in ("0.7", 0, -0.5, float("nan"), True):
        with pytest.raises(ValueError, match="estimate"):
            Table.from_json({**raw, "estimate": wrong})


def test_show_says_the_model_and_the_step_against_plain_ddp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It showed neither: the gain was stored, and dropped when runs' plans were merged, and the
    # workload was only layout-<digest>.
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    store = Store(url)
    gain = Gain(0.914, 0.88, 0.951, 24)
    store.save_table(
        "aaa",
        "layout-2acba524efd1",
        Table(TABLE.classes, 0, FP, gain, model="Net, 23,140 parameters"),
    )
    native = {cls: Entry(Choice("native"), None, 3, "locked") for cls in TABLE.classes}
    store.save_table("bbb", "gpt", Table(native, 0, FP))
    assert main(["show", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "plan aaa/layout-2acba524efd1 (Net, 23,140 parameters): backend=nccl" in out
    assert "; step: 0.91x plain DDP's (24 pairs, 95% interval 0.88-0.95x), final" in out
    assert "; step: 1.00x plain DDP's (its own all-reduce kept), final" in out


def test_forget_drops_every_runs_plan_of_a_workload_and_only_that(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    for run in ("one", "two"):
        Store(url, run_id=run).save_table("aaa", "bert", TABLE)
    Store(url).save_table("aaa", "gpt", TABLE)
    assert main(["forget", "aaa/bert", "--storage", url]) == 0
    assert "forgot plan aaa/bert (2 runs' plans): its next job tunes from scratch" in (
        capsys.readouterr().out
    )
    assert set(Store(url).tables()) == {("aaa", "gpt")}
    assert Store(url).load_table("aaa", "bert") is None
    # A plan stored after counts again; an unknown name is an error listing what is stored.
    Store(url).save_table("aaa", "bert", TABLE)
    assert Store(url).load_table("aaa", "bert") == TABLE
    assert main(["forget", "nope", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "no plan 'nope'" in err and "(stored: aaa/bert, aaa/gpt)" in err, err
    # A workload alone names it under any key.
    assert main(["forget", "gpt", "--storage", url]) == 0
    assert "forgot plan aaa/gpt (1 run's plan)" in capsys.readouterr().out  # it said "1 run' plan"
    assert set(Store(url).tables()) == {("aaa", "bert")}


def test_merged_runs_keep_the_newest_runs_gain_model_and_decision() -> None:
    from autotune.storage import merge_tables

    older = Table(TABLE.classes, 0, FP, Gain(0.8, 0.7, 0.9, 12), model="Net, 9 parameters")
    newer = Table(TABLE.classes, 0, FP, Gain(0.9, 0.85, 0.95, 6), model="Net, 9 parameters",
                  final=False)  # fmt: skip
    merged = merge_tables([(1.0, older), (2.0, newer)])
    assert (merged.gain, merged.model, merged.final) == (newer.gain, newer.model, False)
    assert merge_tables([(2.0, older), (1.0, newer)]).final
