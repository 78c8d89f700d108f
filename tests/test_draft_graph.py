"""The draft step from static buffers (the CUDA-graph path of patch draft-step-graph,
uncaptured on CPU) proposes exactly what stock vLLM proposes, step by step."""

import json
import re

import pytest

from .conftest import SMALL_ENGINE, engine_env, run_engine_job

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(root):"]


def per_request(steps: list[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Each request's drafts in order (which requests share a step varies between runs:
    the engine admits them as they arrive)."""
    out: dict[str, list[list[int]]] = {}
    for step in steps:
        for req, row in step.items():
            out.setdefault(req.split("-")[0], []).append(row)
    return out


@pytest.fixture(scope="module")
def draft_runs(trained_pair_random_drafter, tmp_path_factory):
    target, draft = trained_pair_random_drafter
    runs = {}
    for name, flag in (("stock", "0"), ("static", "1")):
        tmp = tmp_path_factory.mktemp(f"draft-graph-{name}")
        job = {
            "model": target,
            "prompts": PROMPTS,
            "max_tokens": 40,
            "logprobs": None,
            "llm_kwargs": dict(
                SMALL_ENGINE,
                speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 3},
            ),
        }
        env = engine_env(
            VLLM_MLA_DISABLE="1",
            VLLM_K2_SPEC_GUARD="0",  # a fixed k: both engines draft at the same steps
            VLLM_K2_DRAFT_GRAPH=flag,
            VLLM_K2_EXTRA_PATCH_MODULES="tests.draft_recorder",
            DRAFT_RECORD=str(tmp / "drafts.jsonl"),
        )
        r = run_engine_job(tmp, job, env, timeout=900, in_process=True)
        assert r["ok"], (name, r.get("traceback") or r["log"][-4000:])
        r["drafts"] = per_request([json.loads(line) for line in (tmp / "drafts.jsonl").read_text().splitlines()])
        runs[name] = r
    return runs


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_static_buffer_draft_step_proposes_what_stock_proposes(draft_runs):
    stock, static = draft_runs["stock"], draft_runs["static"]
    assert static["patches"]["draft-step-graph"] == "applied"
    assert stock["patches"]["draft-step-graph"] == "not-applicable"
    # the static path ran for decode batches (1 + k tokens a request), and only for those
    shapes = re.findall(r"draft step for (\d+) requests x (\d+) tokens runs from static buffers", static["log"])
    assert shapes and {q for _, q in shapes} == {"4"}, shapes
    assert "stays stock" not in static["log"]  # the build-time check (same drafts as stock) passed
    assert sorted(static["drafts"]) == sorted(stock["drafts"]) == ["0", "1", "2"]
    assert sum(len(v) for v in static["drafts"].values()) > 30
    assert static["drafts"] == stock["drafts"]
    assert [o["token_ids"] for o in static["outputs"]] == [o["token_ids"] for o in stock["outputs"]]


def test_setting_parses_strictly_and_names_the_variable(monkeypatch):
    from vllm_k2_plugin.settings import ENV_DRAFT_GRAPH, draft_graph_setting

    for raw, want in (("", "auto"), ("1", "on"), ("on", "on"), ("0", "off"), ("false", "off")):
        monkeypatch.setenv(ENV_DRAFT_GRAPH, raw)
        assert draft_graph_setting() == want, raw
    monkeypatch.setenv(ENV_DRAFT_GRAPH, "sometimes")
    with pytest.raises(ValueError, match=f"{ENV_DRAFT_GRAPH}='sometimes'"):
        draft_graph_setting()
