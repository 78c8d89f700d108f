"""`vllm-k2 bench ab` against real `vllm serve` processes (latest CPU engine):
baseline, n-gram and EAGLE-3 (the tiny K2.5 wrapper target and its drafter fixture),
one round, single stream. A functional test: it asserts no timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_k2_tools.fixtures import build_draft

from .conftest import engine_env

pytestmark = [pytest.mark.vllm_latest, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench(k25_model, fixture_root, tmp_path_factory):
    draft = build_draft("legacy", str(fixture_root / "draft-legacy-bench"), k25_model)
    out = tmp_path_factory.mktemp("bench")
    serve = "--dtype float32 --max-model-len 2048 --enforce-eager --trust-remote-code --max-num-seqs 4"
    cmd = [
        sys.executable,
        "-m",
        "vllm_k2_plugin.cli",
        "bench",
        "ab",
        "--target",
        k25_model,
        "--mode",
        "ngram",
        "--mode",
        f"eagle3={draft}",
        # a mode whose server cannot start (no drafter there): reported, the others still run
        "--mode",
        'broken={"method": "eagle3", "model": "' + str(fixture_root / "no-such-drafter") + '"}',
        "--serve-args",
        serve,
        # the serving-load set (shared openings, short to long, every other request sampled) at
        # 1 and 3 requests in flight: the per-concurrency load report
        "--prompts",
        "load:6",
        "--concurrency",
        "1,3",
        "--rounds",
        "1",
        "--max-tokens",
        "24",
        "--out",
        str(out),
    ]
    # MHA path: an MLA target + Llama drafter has no common KV block size on vLLM-CPU
    proc = subprocess.run(cmd, env=engine_env(VLLM_MLA_DISABLE="1"), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out, json.loads((out / "bench_ab.json").read_text()), proc.stdout


def test_writes_json_markdown_and_plots(bench):
    out, result, stdout = bench
    for name in ("bench_ab.json", "bench_ab.md", "tok_per_s.png", "acceptance_per_position.png"):
        assert (out / name).stat().st_size > 0, name
    assert "| eagle3-k3 |" in (out / "bench_ab.md").read_text() and "| eagle3-k3 |" in stdout
    assert [m["name"] for m in result["config"]["modes"]] == ["baseline", "ngram-k3", "eagle3-k3", "broken"]
    # the settings the servers ran with are part of the record
    assert result["environment"]["VLLM_MLA_DISABLE"] == "1"
    assert "VLLM_MLA_DISABLE=1" in (out / "bench_ab.md").read_text()


def test_greedy_outputs_identical_across_modes(bench):
    _, result, _ = bench
    lossless = result["summary"]["lossless"]
    assert {m: lossless[m] for m in ("baseline", "ngram-k3", "eagle3-k3")} == {
        "baseline": [],
        "ngram-k3": [],
        "eagle3-k3": [],
    }
    texts = {name: r["texts"] for name, r in result["rounds"][0].items() if name != "broken"}
    # greedy requests' texts (every other load prompt is sampled: None, they may differ between modes)
    for t in texts.values():
        assert len(t) == 6 and [x is None for x in t] == [False, True] * 3


def test_reported_acceptance_equals_vllm_counters(bench):
    _, result, _ = bench
    raw = result["rounds"][0]["eagle3-k3"]["spec_counters"]  # /metrics deltas around the measured requests
    acc = result["summary"]["eagle3-k3"]["acceptance"]
    assert raw["drafts"] > 0 and raw["draft_tokens"] == 3 * raw["drafts"]
    assert 0 < raw["accepted_tokens"] <= raw["draft_tokens"]
    assert sum(raw["accepted_per_position"]) == raw["accepted_tokens"]
    assert acc["mean_acceptance_length"] == pytest.approx(1 + raw["accepted_tokens"] / raw["drafts"])
    assert acc["acceptance_rate"] == pytest.approx(raw["accepted_tokens"] / raw["draft_tokens"])
    assert acc["per_position_acceptance"] == pytest.approx([v / raw["drafts"] for v in raw["accepted_per_position"]])
    assert result["rounds"][0]["baseline"]["spec_counters"]["drafts"] == 0


def test_ratios_are_computed_per_round(bench):
    _, result, _ = bench
    s = result["summary"]
    assert s["baseline"]["1"]["ratio_vs_baseline_median"] == pytest.approx(1.0)
    for mode in ("ngram-k3", "eagle3-k3"):
        r = result["rounds"][0]
        want = (
            r[mode]["by_concurrency"]["1"]["tok_per_s_per_request_median"]
            / r["baseline"]["by_concurrency"]["1"]["tok_per_s_per_request_median"]
        )
        assert s[mode]["1"]["ratio_vs_baseline_median"] == pytest.approx(want)


def test_a_mode_that_fails_to_start_is_reported_and_the_rest_run(bench):
    _, result, _ = bench
    summary = result["summary"]
    assert summary["baseline"]["rounds_ok"] == 1 and summary["eagle3-k3"]["rounds_ok"] == 1
    assert summary["broken"]["rounds_ok"] == 0 and summary["broken"]["errors"]
    assert "vllm serve exited" in summary["broken"]["errors"][0]


def test_load_report_per_concurrency(bench):
    out, result, _ = bench
    for mode in ("baseline", "ngram-k3", "eagle3-k3"):
        row = result["rounds"][0][mode]["by_concurrency"]["3"]
        assert row["requests"] == 6 and row["sampled_requests"] == 3, row
        assert row["aggregate_tok_per_s"] > 0 and row["preemptions"] >= 0
        for what in ("ttft_s", "tpot_s"):
            assert 0 < row[f"{what}_p50"] <= row[f"{what}_p99"], (mode, what, row)
        agg = result["summary"][mode]["3"]
        assert agg["aggregate_ratio_vs_baseline_median"] == pytest.approx(
            row["aggregate_tok_per_s"] / result["rounds"][0]["baseline"]["by_concurrency"]["3"]["aggregate_tok_per_s"]
        )
    assert result["summary"]["eagle3-k3"]["3"]["mean_acceptance_length_median"] >= 1.0
    md = (out / "bench_ab.md").read_text()
    assert "tok/s, all requests" in md and "| eagle3-k3 | 3 |" in md


def test_kv_cache_size_reported_per_mode(bench):
    # Every server gets the same KV space (VLLM_CPU_KVCACHE_SPACE): n-gram adds no layers, so it
    # holds as many tokens as the baseline; the EAGLE-3 drafter's layer takes part of the space.
    out, result, _ = bench
    kv = {mode: result["summary"][mode]["kv_cache_tokens"] for mode in ("baseline", "ngram-k3", "eagle3-k3")}
    assert kv["baseline"] > 0 and kv["ngram-k3"] == kv["baseline"], kv
    assert 0 < kv["eagle3-k3"] < kv["baseline"], kv
    assert result["rounds"][0]["eagle3-k3"]["kv_cache_tokens"] == kv["eagle3-k3"]
    assert f"| {kv['eagle3-k3']} |" in (out / "bench_ab.md").read_text()
