"""Training settings on the command line: booleans parse strictly (`--bf16 on` is True, a
typo is an error, never a silent False)."""

from __future__ import annotations

import pytest

from vllm_k2_plugin.cli import build_parser

BASE = ["train", "train", "--target", "t", "--data", "d", "--vocab", "v", "--out", "o"]


@pytest.mark.parametrize(("text", "value"), [("on", True), ("True", True), ("1", True), ("off", False), ("no", False)])
def test_bool_settings_parse_strictly(text, value):
    assert build_parser().parse_args([*BASE, "--bf16", text]).bf16 is value


def test_a_bad_boolean_is_an_error_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*BASE, "--bf16", "maybe"])
    assert e.value.code == 2
    assert "--bf16" in capsys.readouterr().err
