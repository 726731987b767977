"""Config: checked on construction with messages that name the field; every field from the env."""

from __future__ import annotations

from typing import Any

import pytest

from autotune import Config


def test_defaults() -> None:
    c = Config()
    assert c.algorithm == "auto"
    assert c.fusion_bytes is None  # tuned under "auto"; DDP's buckets with a fixed algorithm
    assert (c.tune_warmup, c.tune_samples, c.tune_trials) == (2, 5, 20)
    assert (c.max_pairs, c.recheck_every) == (24, 200)
    assert c.metrics_port is None
    builtins = (
        "native", "ring", "tree", "two_tree", "hierarchical_ring", "hierarchical_two_tree", "shm"
    )  # fmt: skip
    assert c.candidates[: len(builtins)] == builtins
    # Then what joins "auto" by itself: NCCL's own combinations (autotune-nccl), which a group
    # keeps only where NCCL asks the plugin. The naive baselines (direct, star) do not join.
    joining = c.candidates[len(builtins) :]
    assert "nccl.ring.ll128" in joining and list(joining) == sorted(joining)
    assert all(a.startswith("nccl.") for a in joining)
    assert c.replace(algorithms=("ring",)).candidates == ("ring",)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"algorithm": "rign"}, ValueError, "Config.algorithm: unknown algorithm 'rign' (did you"),
        (
            {"algorithms": ("ring", "nope")},
            ValueError,
            "Config.algorithms: unknown algorithm 'nope'",
        ),
        ({"algorithms": ()}, ValueError, "Config.algorithms: empty"),
        ({"algorithms": "ring"}, TypeError, "Config.algorithms: expected a tuple"),
        ({"segment_bytes": 0}, ValueError, "Config.segment_bytes: must be at least 4096"),
        # One element per round: an 11k-parameter model's first step did not end in 45 s.
        ({"segment_bytes": 3}, ValueError, "Config.segment_bytes: must be at least 4096 bytes"),
        ({"segment_bytes": 1.5}, TypeError, "Config.segment_bytes: expected an int"),
        ({"fusion_bytes": -1}, ValueError, "Config.fusion_bytes: must be 0"),
        # 3 bytes per message made a step take 78 s: refused, with the minimum.
        ({"fusion_bytes": 3}, ValueError, "Config.fusion_bytes: must be 0 (DDP"),
        ({"metrics_host": "not a host"}, ValueError, "Config.metrics_host: expected an address"),
        ({"metrics_port": 70000}, ValueError, "Config.metrics_port: must be in 0..65535"),
        ({"metrics_port": True}, TypeError, "Config.metrics_port: expected an int"),
        ({"timeout_s": 0}, ValueError, "Config.timeout_s: expected a positive number"),
        ({"timeout_s": float("nan")}, ValueError, "Config.timeout_s"),
        # gloo adds it to its clock in nanoseconds: 1e10 s wrapped and failed step 1.
        (
            {"timeout_s": 1e10},
            ValueError,
            "Config.timeout_s: expected a positive number of seconds, at most 604800 (a week",
        ),
        ({"timeout_s": 1e30}, ValueError, "at most 604800"),
        ({"storage": "  "}, ValueError, "Config.storage: expected an Optuna storage URL"),
        ({"tune_samples": 0}, ValueError, "Config.tune_samples: must be >= 1"),
        ({"tune_warmup": -1}, ValueError, "Config.tune_warmup: must be >= 0"),
        ({"tune_trials": 0}, ValueError, "Config.tune_trials: must be >= 1"),
        ({"max_pairs": 5}, ValueError, "Config.max_pairs: must be >= 6"),
        ({"recheck_every": -1}, ValueError, "Config.recheck_every: must be >= 0"),
        ({"metrics_host": ""}, ValueError, "Config.metrics_host: expected an address"),
        ({"job": ""}, ValueError, "Config.job: expected a non-empty label value"),
        ({"workload": ""}, ValueError, "Config.workload: expected a non-empty name"),
        ({"workload": "bert/large"}, ValueError, "Config.workload: 'bert/large' has a '/'"),
        ({"workload": "sweep"}, ValueError, "Config.workload: 'sweep' is autotune's own"),
        ({"workload": "layout-0a1b"}, ValueError, "Config.workload: 'layout-0a1b' is autotune's"),
        (
            {"algorithm": "ring", "plan_file": "plan.json"},
            ValueError,
            "Config.plan_file: a tuned table chooses per size class",
        ),
    ],
)
def test_bad_values_name_the_field(kwargs: dict[str, object], error: type, words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(".", r"\.")):
        Config(**kwargs)  # type: ignore[arg-type]


def test_plugin_algorithms_are_valid_choices() -> None:
    assert Config(algorithm="star").algorithm == "star"
    assert Config(algorithms=["ring", "direct"]).algorithms == ("ring", "direct")  # type: ignore[arg-type]


def test_every_field_from_the_environment() -> None:
    env = {
        "AUTOTUNE_ALGORITHM": "two_tree",
        "AUTOTUNE_ALGORITHMS": "ring, tree",
        "AUTOTUNE_SEGMENT_BYTES": "256K",
        "AUTOTUNE_FUSION_BYTES": "4MiB",
        "AUTOTUNE_STORAGE": "sqlite:////tmp/x.db",
        "AUTOTUNE_METRICS_PORT": "9400",
        "AUTOTUNE_TIMEOUT_S": "12.5",
        "AUTOTUNE_TUNE_WARMUP": "1",
        "AUTOTUNE_TUNE_SAMPLES": "7",
        "AUTOTUNE_TUNE_TRIALS": "9",
        "AUTOTUNE_MAX_PAIRS": "10",
        "AUTOTUNE_RECHECK_EVERY": "0",
        "AUTOTUNE_METRICS_HOST": "0.0.0.0",
        "AUTOTUNE_JOB": "llm-pretrain",
        "AUTOTUNE_WORKLOAD": "gpt2-small",
        "UNRELATED": "ignored",
    }
    c = Config.from_env(env)
    assert c == Config(
        algorithm="two_tree",
        algorithms=("ring", "tree"),
        segment_bytes=256 << 10,
        fusion_bytes=4 << 20,
        storage="sqlite:////tmp/x.db",
        metrics_port=9400,
        timeout_s=12.5,
        tune_warmup=1,
        tune_samples=7,
        tune_trials=9,
        max_pairs=10,
        recheck_every=0,
        metrics_host="0.0.0.0",
        job="llm-pretrain",
        workload="gpt2-small",
    )


def test_environment_none_and_overrides() -> None:
    env = {"AUTOTUNE_METRICS_PORT": "none", "AUTOTUNE_ALGORITHM": "ring"}
    c = Config.from_env(env, algorithm="tree")
    assert c.metrics_port is None
    assert c.algorithm == "tree"  # keyword arguments win


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"AUTOTUNE_FUSION_BYTES": "lots"}, "AUTOTUNE_FUSION_BYTES='lots': not a byte count"),
        ({"AUTOTUNE_METRICS_PORT": "http"}, "AUTOTUNE_METRICS_PORT='http'"),
        ({"AUTOTUNE_ALGORITHM": "fastest"}, "AUTOTUNE_ALGORITHM='fastest': unknown algorithm"),
        ({"AUTOTUNE_FUSION_BYTES": "inf"}, "AUTOTUNE_FUSION_BYTES='inf': not a byte count"),
        ({"AUTOTUNE_FUSION_BYTES": "nan"}, "AUTOTUNE_FUSION_BYTES='nan': not a byte count"),
        ({"AUTOTUNE_FUSION_BYTES": "3"}, "AUTOTUNE_FUSION_BYTES='3': must be 0 .* at least 4096"),
        ({"AUTOTUNE_SEGMENT_BYTES": "3"}, "AUTOTUNE_SEGMENT_BYTES='3': must be at least 4096"),
        ({"AUTOTUNE_TIMEOUT_S": "1e10"}, "AUTOTUNE_TIMEOUT_S='1e10': .* at most 604800"),
        ({"AUTOTUNE_TIMEOUT_S": "1e30"}, "AUTOTUNE_TIMEOUT_S='1e30': .* at most 604800"),
        # A misspelt setting is an error that suggests the field, not silently ignored.
        ({"AUTOTUNE_TIMEOUT": "5"}, "AUTOTUNE_TIMEOUT is not .*did you mean AUTOTUNE_TIMEOUT_S"),
        ({"AUTOTUNE_FUSION": "4M"}, "AUTOTUNE_FUSION is not .*did you mean AUTOTUNE_FUSION_BYTES"),
    ],
)
def test_bad_environment_says_which_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Config.from_env(env)


def test_another_tools_variable_with_our_prefix_is_a_warning_not_a_stop() -> None:
    # An empty AUTOTUNE_STORAGE_DIR that another tool set once stopped every rank.
    with pytest.warns(UserWarning, match="AUTOTUNE_STORAGE_DIR is not an autotune setting, and"):
        assert Config.from_env({"AUTOTUNE_STORAGE_DIR": ""}) == Config()
    # A slip of one of ours stays an error: a setting the user believes is on.
    with pytest.raises(ValueError, match=r"did you mean AUTOTUNE_ALGORITHM\?"):
        Config.from_env({"AUTOTUNE_ALGORITM": "ring"})


def test_our_variables_that_are_not_fields_are_not_misspellings() -> None:
    # AUTOTUNE_NODE_ID is read by autotune.comm.topology, not by Config.
    assert Config.from_env({"AUTOTUNE_NODE_ID": "rack1-host7"}) == Config()
    with pytest.raises(ValueError, match="did you mean AUTOTUNE_NODE_ID"):
        Config.from_env({"AUTOTUNE_NODE_IDS": "x"})
    # The NCCL plugins' own (autotune-nccl reads them in C), set in the same environment.
    plugins = {"AUTOTUNE_NCCL_TABLE": "plan.csv", "AUTOTUNE_NCCL_PROFILER": "1",
               "AUTOTUNE_NCCL_SHM": "0", "AUTOTUNE_NCCL_SHM_DIR": "/tmp",
               "AUTOTUNE_NCCL_PROFILER_CHAIN": "/opt/inspector.so",
               "AUTOTUNE_NCCL_PROFILER_SAMPLE": "10"}  # fmt: skip
    assert Config.from_env(plugins) == Config()
    with pytest.raises(ValueError, match="did you mean AUTOTUNE_NCCL_SHM_DIR"):
        Config.from_env({"AUTOTUNE_NCCL_SHM_DIRS": "/tmp"})


def test_replace_checks_again() -> None:
    with pytest.raises(ValueError, match="fusion_bytes"):
        Config().replace(fusion_bytes=-5)


def test_old_spellings_still_work_for_a_release_with_a_deprecation_warning() -> None:
    # Config(step_aside=...), Config(duel_pairs=...), the attributes and AUTOTUNE_STEP_ASIDE /
    # AUTOTUNE_DUEL_PAIRS: the same fields as unhook and max_pairs, each saying so.
    with pytest.warns(DeprecationWarning, match=r"Config\(step_aside=...\) is deprecated"):
        old: dict[str, Any] = {"step_aside": False, "duel_pairs": 10}
        c = Config(**old)
    assert (c.unhook, c.max_pairs) == (False, 10)
    with pytest.warns(DeprecationWarning, match="use Config.unhook"):
        assert c.step_aside is False
    with pytest.warns(DeprecationWarning, match="use Config.max_pairs"):
        assert c.duel_pairs == 10
    with pytest.warns(DeprecationWarning, match="AUTOTUNE_STEP_ASIDE is deprecated"):
        from_env = Config.from_env({"AUTOTUNE_STEP_ASIDE": "0", "AUTOTUNE_DUEL_PAIRS": "8"})
    assert (from_env.unhook, from_env.max_pairs) == (False, 8)
    with pytest.warns(DeprecationWarning):
        assert c.replace(step_aside=True).unhook is True
    # Both spellings at once must agree; the same variable under both names is refused.
    with pytest.raises(ValueError, match="disagree"):
        both: dict[str, Any] = {"step_aside": False, "unhook": True}
        Config(**both)
    with pytest.raises(ValueError, match="both set"):
        Config.from_env({"AUTOTUNE_STEP_ASIDE": "0", "AUTOTUNE_UNHOOK": "1"})


def test_sizes_given_as_text_read_as_the_environment_reads_them() -> None:
    # AUTOTUNE_FUSION_BYTES=4M worked but Config(fusion_bytes="4M") was a TypeError.
    text: dict[str, Any] = {"fusion_bytes": "4M", "segment_bytes": "64K"}
    c = Config(**text)
    assert (c.fusion_bytes, c.segment_bytes) == (4 << 20, 64 << 10)
    assert c == Config.from_env({"AUTOTUNE_FUSION_BYTES": "4M", "AUTOTUNE_SEGMENT_BYTES": "64K"})
    with pytest.raises(ValueError, match=r"Config.fusion_bytes: not a byte count: 'lots'"):
        Config(**dict[str, Any](fusion_bytes="lots"))
    with pytest.raises(ValueError, match="at least 4096 bytes"):
        Config(**dict[str, Any](segment_bytes="1K"))
