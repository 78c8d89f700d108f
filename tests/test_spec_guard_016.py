"""The speculation guard on vLLM 0.16 (no per-step k in vLLM: the guard trims drafts itself),
inside vLLM 0.16's own Scheduler and AsyncScheduler driven as the engine core drives them
(tests/guard_scheduler_drive.py: the model step is a sleep that grows with the verify width;
vLLM 0.16 cannot speculate on the CPU, so no engine can run this)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm016

DRIVE = Path(__file__).with_name("guard_scheduler_drive.py")
K = 3


@pytest.fixture(scope="module")
def driven(trained_pair_random_drafter) -> dict:
    from .conftest import engine_env

    target, draft = trained_pair_random_drafter
    out = subprocess.run(
        [sys.executable, str(DRIVE), target, draft, "never:sync", "always:sync", "never:async"],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _widths(run: dict) -> list[int]:
    """Drafts verified per step (the widest request)."""
    return [max(s["drafts"].values(), default=0) for s in run["steps"]]


@pytest.mark.parametrize("case", ["never:sync", "never:async"])
def test_drafts_never_accepted_turn_speculation_off_within_the_warmup(driven, case):
    run = driven[case]
    assert run["states"] == {"spec-guard": "applied", "spec-guard-drafter-off": "applied"}
    assert run["guard"], "the guard did not attach to vLLM 0.16's scheduler"
    assert run["decisions"][:1] == [[2, K, 0]], run["decisions"]  # bucket 2: 4-7 requests
    switch = next(i for i, s in enumerate(run["steps"]) if s["k"] == 0 and i > 16)
    assert switch <= 32, [s["k"] for s in run["steps"][:40]]
    after = run["steps"][switch:]
    # at k = 0 nothing is verified and the drafter is skipped; only the short probes draft
    assert all(max(s["drafts"].values(), default=0) == 0 and s["skipped"] for s in after if s["k"] == 0)
    probing = sum(1 for w in _widths(run)[switch:] if w)
    assert probing <= 0.15 * len(after), _widths(run)
    assert run["outputs"] == {f"r{i}": 160 for i in range(4)}


def test_the_step_after_a_skipped_drafter_verifies_no_placeholder_drafts(driven):
    """0.16's runner leaves zeros where a skipped drafter's drafts would be (the engine core
    hands them to the scheduler): the next step must not verify them."""
    steps = driven["never:sync"]["steps"]
    after_skip = [nxt for s, nxt in zip(steps, steps[1:], strict=False) if s["skipped"] and nxt["k"]]
    assert after_skip and all(max(s["drafts"].values(), default=0) == 0 for s in after_skip), after_skip


def test_drafts_always_accepted_keep_full_k(driven):
    run = driven["always:sync"]
    assert run["decisions"] == []
    widths = _widths(run)
    assert widths.count(K) >= 0.75 * len(widths), widths
    assert run["outputs"] == {f"r{i}": 160 for i in range(4)}
