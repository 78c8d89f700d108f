"""One vocabulary across every `vllm-k2` subcommand, checked over the whole parser tree:
`--target` names the target model, `--draft` the drafter, `--out` a path the command
writes, `--json` (a flag) JSON on stdout, `--data` only chat files (`train prepare`).
Earlier spellings still parse, to the same values."""

from __future__ import annotations

import argparse

import pytest

from vllm_k2_plugin.cli import build_parser

pytestmark = pytest.mark.vllm_independent

#: commands that break a rule today, with the reason; the test fails once they comply
#: (then delete the entry).
PENDING: dict = {}
#: positionals kept for old scripts, each beside its option (dest NAME_opt)
DEPRECATED_POSITIONALS = {("bench ab", "target"): "--target", ("fixture", "out"): "--out"}
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
        if "--model" in opts and "--target" not in opts:
            out.append("--model is not an alias of --target")
        if "--json" in opts and a.nargs != 0:
            out.append("--json takes a value")
        if "--format" in opts and "json" in (a.choices or ()) and "--json" not in parser._option_string_actions:
            out.append("--format json without a --json flag")
        if "--data" in opts and command != "train prepare" and "--extracted" not in opts:
            out.append("--data means something other than chat files")
        for bad in ("--output", "--out-dir", "--output-dir", "--model-dir"):
            if bad in opts:
                out.append(f"{bad} instead of --out / --target")
        if not a.option_strings and a.dest not in ("help",):
            key = (command, a.dest)
            if key in DEPRECATED_POSITIONALS:
                twin = parser._option_string_actions.get(DEPRECATED_POSITIONALS[key])
                if twin is None or twin.dest != f"{a.dest}_opt":
                    out.append(f"positional {a.dest} without its option {DEPRECATED_POSITIONALS[key]}")
            elif key not in SUBJECT_POSITIONALS:
                out.append(f"positional {a.dest}")
    return out


def test_every_subcommand_speaks_the_one_vocabulary():
    leaves = dict(_leaves(build_parser()))
    assert {"doctor", "eagle3 check", "bench ab", "bench mla", "train prepare", "train plan", "fixture"} <= set(leaves)
    found = {(cmd, v) for cmd, p in leaves.items() for v in _violations(cmd, p)}
    assert found - set(PENDING) == set(), sorted(found - set(PENDING))
    assert set(PENDING) - found == set(), f"fixed, delete from PENDING: {sorted(set(PENDING) - found)}"


@pytest.mark.parametrize(
    "new, old, dest",
    [
        (["train", "train", "--target", "t", "--extracted", "x", "--vocab", "v", "--out", "o"],
         ["train", "train", "--target", "t", "--data", "x", "--vocab", "v", "--out", "o"], "extracted"),
        (["train", "eval", "--draft", "d", "--target", "t", "--extracted", "x", "--out", "o"],
         ["train", "eval", "--draft", "d", "--target", "t", "--data", "x", "--out", "o"], "extracted"),
        (["patches", "list", "--register"], ["patches", "list", "--apply"], "register"),
        (["fixture", "k25", "--out", "o"], ["fixture", "k25", "o"], None),
        (["bench", "ab", "--target", "t", "--mode", "ngram"], ["bench", "ab", "t", "--mode", "ngram"], None),
    ],
)  # fmt: skip
def test_earlier_spellings_still_parse_to_the_same_values(new, old, dest):
    p = build_parser()
    a, b = p.parse_args(new), p.parse_args(old)
    if dest:
        assert getattr(a, dest) == getattr(b, dest) not in (None, False)
    else:  # a deprecated positional beside its option
        name = "out" if new[0] == "fixture" else "target"
        assert getattr(a, f"{name}_opt") == getattr(b, name) and getattr(a, name) is None


def test_fixture_without_an_output_is_one_error_line(capsys):
    from vllm_k2_plugin.cli import main

    assert main(["fixture", "k25"]) == 2
    assert capsys.readouterr().err.strip() == "vllm-k2 fixture: error: the output directory is missing (--out DIR)"
