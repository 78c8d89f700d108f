"""Command-line values parse strictly: training booleans (`--bf16 on` is True, a typo is
an error, never a silent False) and `bench ab`'s lists and modes (one error line, exit 2)."""

from __future__ import annotations

import pytest

from vllm_k2_plugin.cli import build_parser

pytestmark = pytest.mark.vllm_independent

BASE = ["train", "train", "--target", "t", "--extracted", "d", "--vocab", "v", "--out", "o"]


@pytest.mark.parametrize(("text", "value"), [("on", True), ("True", True), ("1", True), ("off", False), ("no", False)])
def test_bool_settings_parse_strictly(text, value):
    assert build_parser().parse_args([*BASE, "--bf16", text]).bf16 is value


def test_a_bad_boolean_is_an_error_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*BASE, "--bf16", "maybe"])
    assert e.value.code == 2
    assert "--bf16" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--mode", "ngram", "--concurrency", "1,x"], "--concurrency"),
        (["--mode", "ngram", "--concurrency", "0"], "--concurrency"),
        (["--mode", "medusa"], "--mode"),
    ],
)
def test_bad_bench_arguments_are_one_error_line_and_exit_2(capsys, args, option):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "ab", "--target", "/models/x", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vllm-k2 bench ab: error: argument") and option in err[-1], err


def test_two_bench_modes_of_one_name_are_an_error(capsys):
    from vllm_k2_plugin.cli import main

    assert main(["bench", "ab", "--target", "/m", "--mode", "eagle3=/a:3", "--mode", "eagle3=/b:3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vllm-k2 bench ab: error: --mode") and "eagle3-k3" in err[-1], err


def test_good_bench_arguments_parse():
    a = build_parser().parse_args(["bench", "ab", "--target", "/m", "--mode", "eagle3=/d:4", "--concurrency", "1,8"])
    assert a.concurrency == [1, 8] and a.mode == ["eagle3=/d:4"]


def test_one_vocabulary_for_the_target_and_json():
    p = build_parser()
    for stage, extra in (
        ("prepare", ["--data", "c.jsonl"]),
        ("extract", ["--prepared", "p"]),
        ("vocab", ["--prepared", "p"]),
    ):
        assert p.parse_args(["train", stage, "--target", "/t", "--out", "o", *extra]).target == "/t"
    assert p.parse_args(["bench", "ab", "--target", "/t", "--mode", "ngram"]).target == "/t"
    assert p.parse_args(["train", "plan", "--json"]).format == "json"
