"""One vocabulary across every `vllm-k2` subcommand, checked over the whole parser tree:
`--target` names the target model, `--draft` the drafter, `--out` a path the command
writes, `--json` (a flag) JSON on stdout, `--data` only chat files (`train prepare`).
The package is unreleased: no earlier spelling is kept beside these."""

from __future__ import annotations

import argparse

import pytest

from vllm_k2_plugin.cli import build_parser

pytestmark = pytest.mark.vllm_independent

#: commands that break a rule today, with the reason; the test fails once they comply
#: (then delete the entry).
PENDING: dict = {}
#: positionals that are the command's subject, not a model or an output
SUBJECT_POSITIONALS = {("train run", "recipe"), ("fixture", "kind"), ("gguf check", "gguf")}


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*prefix, name))


def _violations(command: str, parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for a in parser._actions:
        opts = set(a.option_strings)
        if "--model" in opts:
            out.append("--model instead of --target")
        if "--json" in opts and a.nargs != 0:
            out.append("--json takes a value")
        if "--format" in opts and "json" in (a.choices or ()) and "--json" not in parser._option_string_actions:
            out.append("--format json without a --json flag")
        if "--data" in opts and command != "train prepare":
            out.append("--data means something other than chat files")
        for bad in ("--output", "--out-dir", "--output-dir", "--model-dir"):
            if bad in opts:
                out.append(f"{bad} instead of --out / --target")
        if not a.option_strings and a.dest not in ("help",):
            if (command, a.dest) not in SUBJECT_POSITIONALS:
                out.append(f"positional {a.dest}")
    return out


def test_every_subcommand_speaks_the_one_vocabulary():
    leaves = dict(_leaves(build_parser()))
    assert {"doctor", "eagle3 check", "bench ab", "bench mla", "train prepare", "train plan", "fixture"} <= set(leaves)
    found = {(cmd, v) for cmd, p in leaves.items() for v in _violations(cmd, p)}
    assert found - set(PENDING) == set(), sorted(found - set(PENDING))
    assert set(PENDING) - found == set(), f"fixed, delete from PENDING: {sorted(set(PENDING) - found)}"


@pytest.mark.parametrize(
    "old",
    [
        ["train", "train", "--target", "t", "--data", "x", "--vocab", "v", "--out", "o"],
        ["train", "eval", "--draft", "d", "--target", "t", "--data", "x", "--out", "o"],
        ["train", "extract", "--model", "t", "--prepared", "p", "--out", "o"],
        ["patches", "list", "--apply"],
        ["fixture", "k25", "o"],
        ["bench", "ab", "t", "--mode", "ngram"],
    ],
)
def test_dev_only_spellings_are_gone(old, capsys):
    """Spellings from before the vocabulary was fixed are refused, not kept as aliases."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(old)
    assert "error:" in capsys.readouterr().err


def test_fixture_without_an_output_is_one_error_line(capsys):
    from vllm_k2_plugin.cli import main

    assert main(["fixture", "k25"]) == 2
    assert capsys.readouterr().err.strip() == "vllm-k2 fixture: error: the output directory is missing (--out DIR)"
