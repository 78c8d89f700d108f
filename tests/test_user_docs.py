"""What a user reads: README.md, CHANGELOG.md and docs/ speak plainly and stay true to the repository.

* No internal vocabulary in prose (names of GPU bookings, build nicknames, benchmark case
  sets, issue items). Code spans that hold a path or a command (they contain "/" or a
  script name) may name a harness argument or a results folder: a reader can run or open them.
* The README's table of vLLM releases has one row for every release from 0.16 to the
  newest, every release the README names is in it, and each row that says something ran
  links to a file that exists.
* Public reference numbers (not ours) sit beside their source.
* Every speed number in the README's table of measurements names its weight format and
  concurrency.
* docs/layout.md names folders that exist and every folder of both packages (runtime and tools).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_independent

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))

#: Words a user cannot know: (pattern, why it is banned). Case-insensitive unless the
#: pattern sets its own flags.
INTERNAL_TERMS = [
    (r"\broute[- ][A-Z]\b", "a build nickname: say what was built (e.g. 0.16's own kernels rebuilt for PyTorch 2.11)"),
    (r"\bcalls? \d+", "a GPU booking's number: say the date, or define 'session' once"),
    (r"\blease\d*\b", "a GPU booking: say 'GPU session'"),
    (r"(?-i:\bdg[a-z0-9]*\b)", "a benchmark case-set name: say what the cases measure"),
    (r"\bslice-k\b", "a benchmark case name"),
    (r"\bsuite `?dg", "a benchmark case-set name"),
    (r"\bissue #?\d+", "an issue number: say what the user gets"),
    (r"#\d+ item \d+", "an issue item"),
]
#: Reference numbers measured by others: each must appear next to "Source:".
REFERENCE_NUMBERS = ["86.9", "117.1"]
FIRST_RELEASE, NEWEST_RELEASE = 16, 34  # vLLM 0.16 ... 0.34


def _prose(text: str) -> str:
    """The text a reader reads as words: fenced blocks and path/command code spans removed."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", lambda m: "" if re.search(r"/|\.(py|sh|json)\b", m.group(0)) else m.group(0), text)


def internal_terms(text: str) -> list[str]:
    """'line N: <match> (<why>)' for each internal term in the prose of a Markdown text."""
    prose = _prose(text)
    found = []
    for pattern, why in INTERNAL_TERMS:
        for m in re.finditer(pattern, prose, flags=re.I):
            line = prose.count("\n", 0, m.start()) + 1
            found.append(f"line ~{line}: {m.group(0)!r} ({why})")
    return found


@pytest.mark.parametrize("path", [README, REPO / "CHANGELOG.md", *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_vocabulary(path):
    found = internal_terms(path.read_text())
    assert not found, f"{path.relative_to(REPO)} uses internal words:\n" + "\n".join(found)


def test_the_term_check_finds_each_kind_of_term():
    """The patterns catch what they are for and leave commands and ordinary words alone."""
    for bad in ["on route B", "in call 7", "device calls lease1-8", "suite dg24stock", "`dgmoe`", "issue 37"]:
        assert internal_terms(bad), bad
    for fine in [
        "released",
        "8x HGX/DGX B200",
        "`python benchmarks/gpu_engine_e2e.py run dgmoe`",
        "```\nroute B\n```",
        "a call to vLLM",
    ]:
        assert not internal_terms(fine), fine


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines() if line.startswith("|")
    ]
    return rows[2:]  # header and rule first


def _minors(cell: str) -> list[int]:
    """'0.16' -> [16]; '0.21 – 0.31' -> [21, ..., 31]."""
    found = [int(m) for m in re.findall(r"\b0\.(\d+)\b", cell)]
    if len(found) == 2 and re.search(r"[–-]", cell):
        return list(range(found[0], found[1] + 1))
    return found


def test_release_table_covers_every_release():
    text = README.read_text()
    rows = _table_rows(_section(text, "vLLM releases"))
    covered = [m for row in rows for m in _minors(row[0])]
    assert covered == list(range(FIRST_RELEASE, NEWEST_RELEASE + 1)), (
        f"README's vLLM release table rows cover 0.{covered}; expected each of 0.{FIRST_RELEASE}..0.{NEWEST_RELEASE} "
        "once, in order"
    )
    named = {int(m) for m in re.findall(r"\bvLLM(?:-CPU)? 0\.(\d+)\b", text, flags=re.I)}
    missing = sorted(n for n in named if n not in covered)
    assert not missing, f"README names vLLM releases without a row in its release table: {missing}"
    for row in rows:
        ran = not row[1].lower().startswith("nothing")
        links = re.findall(r"\]\(([^)#]+)", row[2])
        if ran:
            assert links, f"release row {row[0]!r} says something ran but links no results: {row[2]!r}"
        for link in links:
            assert (REPO / link).exists(), f"release row {row[0]!r} links {link}, which does not exist"


def test_reference_numbers_carry_their_source():
    blocks = re.split(r"\n\s*\n|\n(?=\* )", README.read_text())
    for number in REFERENCE_NUMBERS:
        holding = [b for b in blocks if re.search(rf"\b{re.escape(number)}\b", b)]
        assert holding, f"README no longer quotes the reference number {number}: update REFERENCE_NUMBERS"
        for block in holding:
            assert re.search(r"Source: .*github\.com/\S+", block, flags=re.S), (
                f"README quotes {number} without 'Source: github.com/...' beside it:\n{block}"
            )


def test_every_speed_number_names_weights_and_concurrency():
    rows = _table_rows(_section(README.read_text(), "Does speculation pay on my setup?"))
    assert rows, "README: the table of measurements is gone"
    for what, _measured, results in rows:
        assert re.search(r"float32|bf16|fp8|int4|Q\d_K", what), f"measurement row names no weight format: {what!r}"
        assert re.search(r"one request|concurrency \d+|\d+ requests", what), f"row names no concurrency: {what!r}"
        assert re.search(r"\]\(benchmarks/results/", results), f"row links no results file: {results!r}"


def _layout_paths() -> list[str]:
    block = re.search(r"^```\n(.*?)^```", (REPO / "docs" / "layout.md").read_text(), flags=re.S | re.M).group(1)
    paths, parent = [], ""
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name or not re.match(r"^[\w./-]+$", name):
            continue  # a continued description
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            parent = name if name.endswith("/") else ""
            paths.append(name)
        else:
            paths.append(parent + name)
    return paths


def test_layout_doc_matches_the_tree():
    paths = _layout_paths()
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"
    # Both distributions' packages. A folder holding only __pycache__ is what a checkout keeps of a
    # moved folder (git does not remove ignored files): not part of the tree.
    folders = sorted(
        f"{package}/{d.name}/"
        for package in ("vllm_k2_plugin", "vllm_k2_tools")
        for d in (REPO / package).iterdir()
        if d.is_dir() and any(f.is_file() and "__pycache__" not in f.parts for f in d.rglob("*"))
    )
    unnamed = [f for f in folders if f not in paths]
    assert not unnamed, f"docs/layout.md does not name these package folders: {unnamed}"
