"""`bench ab`'s per-round summary on hand-made rounds (no server): what a mode that never
ran reports."""

from __future__ import annotations

import pytest

from vllm_k2_tools.bench.ab import ABConfig, Mode, summarize_rounds

pytestmark = pytest.mark.vllm_independent


def _ran(texts: list[str], tok_s: float) -> dict:
    counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    return {"texts": texts, "by_concurrency": {"1": {"tok_per_s_per_request_median": tok_s}},
            "spec_counters": counters}  # fmt: skip


def test_a_mode_that_never_ran_has_no_lossless_verdict():
    cfg = ABConfig(model="m", modes=[Mode.parse("baseline"), Mode.parse("ngram"), Mode("broken", {})], prompts=[])
    rounds = [{"baseline": _ran(["a", "b"], 10.0), "ngram-k3": _ran(["a", "x"], 15.0), "broken": {"error": "boom"}}]
    s = summarize_rounds(cfg, rounds)
    assert s["lossless"] == {"baseline": [], "ngram-k3": [1], "broken": None}
    assert s["broken"]["rounds_ok"] == 0 and s["broken"]["errors"] == ["boom"]
    assert s["ngram-k3"]["1"]["ratio_vs_baseline_median"] == pytest.approx(1.5)
