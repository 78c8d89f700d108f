"""`bench ab`'s per-round summary on hand-made rounds (no server): what a mode that never
ran reports."""

from __future__ import annotations

import pytest

from vllm_k2_tools.bench.ab import ABConfig, Mode, summarize_rounds

pytestmark = pytest.mark.vllm_independent


def _ran(texts: list[str], tok_s: float) -> dict:
    counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    return {"texts": texts, "by_concurrency": {"1": {"tok_per_s_per_request_median": tok_s}}, "spec_counters": counters}


def test_a_mode_that_never_ran_has_no_lossless_verdict():
    cfg = ABConfig(model="m", modes=[Mode.parse("baseline"), Mode.parse("ngram"), Mode("broken", {})], prompts=[])
    rounds = [{"baseline": _ran(["a", "b"], 10.0), "ngram-k3": _ran(["a", "x"], 15.0), "broken": {"error": "boom"}}]
    s = summarize_rounds(cfg, rounds)
    assert s["lossless"] == {"baseline": [], "ngram-k3": [1], "broken": None}
    assert s["broken"]["rounds_ok"] == 0 and s["broken"]["errors"] == ["boom"]
    assert s["ngram-k3"]["1"]["ratio_vs_baseline_median"] == pytest.approx(1.5)


def test_sampled_requests_are_left_out_of_the_lossless_check_and_load_figures_summarised():
    cfg = ABConfig(model="m", modes=[Mode.parse("baseline"), Mode.parse("ngram")], prompts=[])
    base, spec = _ran(["a", None], 10.0), _ran(["a", None], 12.0)  # None: a sampled request
    base["by_concurrency"]["1"].update(aggregate_tok_per_s=40.0, tpot_s_p99=0.02, preemptions=1.0)
    spec["by_concurrency"]["1"].update(
        aggregate_tok_per_s=30.0, tpot_s_p99=0.05, preemptions=3.0, acceptance={"mean_acceptance_length": 1.4}
    )
    s = summarize_rounds(cfg, [{"baseline": base, "ngram-k3": spec}])
    assert s["lossless"] == {"baseline": [], "ngram-k3": []}
    one = s["ngram-k3"]["1"]
    assert one["aggregate_ratio_vs_baseline_median"] == pytest.approx(0.75)
    assert one["tpot_s_p99_median"] == pytest.approx(0.05) and one["preemptions"] == 3.0
    assert one["mean_acceptance_length_median"] == pytest.approx(1.4)


def test_the_load_prompt_set_shares_prefixes_spans_lengths_and_samples_half():
    from vllm_k2_tools.bench.prompts import LOAD_HEADS, load_prompts

    prompts = load_prompts("load:12")
    assert len(prompts) == 12
    assert all(any(p["prompt"].startswith(h) for h in LOAD_HEADS) for p in prompts)
    assert len({p["prompt"].split("\n\n")[0] for p in prompts}) == len(LOAD_HEADS)
    lengths = sorted(len(p["prompt"]) for p in prompts)
    assert lengths[-1] > 4 * lengths[0]
    sampled = [p for p in prompts if p.get("temperature", 0.0) > 0]
    assert len(sampled) == 6 and len({p["seed"] for p in sampled}) == 6


def test_a_prompt_file_carries_sampling_and_names_a_bad_field(tmp_path):
    from vllm_k2_tools.bench.client import request_body
    from vllm_k2_tools.bench.prompts import load_prompts

    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "hi", "temperature": 0.7, "seed": 5}\n{"prompt": "there"}\n')
    rows = load_prompts(str(good))
    assert rows[0]["temperature"] == 0.7 and rows[0]["seed"] == 5 and "temperature" not in rows[1]
    body = request_body("m", rows[0]["prompt"], 8, rows[0]["temperature"], rows[0]["seed"])
    assert body["temperature"] == 0.7 and body["seed"] == 5
    assert "seed" not in request_body("m", "x", 8)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "seed": "five"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'seed'"):
        load_prompts(str(bad))
