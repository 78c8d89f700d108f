"""The whole EAGLE-3 training pipeline on real engines, with a target that learned
something (the committed tiny K2.5-architecture model trained on Python code):

* vLLM 0.16 engine: `vllm-k2 train run` — regeneration of the answers by the target
  through `vllm serve`, hidden-state extraction through the speculators shim, vocab,
  training, export, offline eval.
* latest engine: the exported drafter served with EAGLE-3 (k = 3) on held-out prompts;
  tau from vLLM's own spec-decode counters, compared with the offline eval.

The two engines live in two venvs (ci/test.sh runs the suite once per venv). They share
the run through VLLM_K2_E2E_DIR; the latest-engine test (re)runs the recipe in the 0.16
venv itself when that run is not there, and `run` skips every stage already done.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import IS_016, REPO, SMALL_ENGINE, engine_env, run_engine_job

pytestmark = pytest.mark.slow

# Floors below what this pipeline measured with CI_RECIPE (4 epochs, 2026-12-07: offline tau(3)
# 2.70 over every position, 2.41 replaying greedy decoding's draft positions; vLLM 2.42), not
# wishes. 6 epochs measured 2.87 / 2.55 / 2.56; the full tiny recipe (16 epochs, 5 TTT steps)
# 3.05 / 2.85 / 2.85.
TAU3_OFFLINE_FLOOR = 2.5
TAU3_VLLM_FLOOR = 2.3
AGREEMENT = 0.10  # |offline (served positions) - vLLM| / vLLM


def _e2e_dir(tmp_path_factory) -> Path:
    root = os.environ.get("VLLM_K2_E2E_DIR")
    return Path(root) if root else tmp_path_factory.mktemp("e2e")


@contextlib.contextmanager
def _run_lock(root: Path):
    """One writer at a time in the shared run directory: ci/test.sh runs the 0.16 and the latest
    engine tiers side by side, and both fixtures below run or resume the same recipe there."""
    with open(root / ".run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _python_016() -> str:
    """The vLLM 0.16 venv's python (ci/test.sh exports it; else build/reuse it)."""
    venv = os.environ.get("VLLM_K2_VENV_VLLM016")
    if not venv:
        venv = (
            subprocess.run(
                ["bash", str(REPO / "ci" / "engine.sh"), "vllm016"], check=True, capture_output=True, text=True
            )
            .stdout.strip()
            .splitlines()[-1]
        )
    return str(Path(venv) / "bin" / "python")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Run (or resume) the recipe in the 0.16 venv; return the work dir and timings."""
    from vllm_k2_tools.fixtures.trained_target import CI_RECIPE, write_tiny_recipe

    root = _e2e_dir(tmp_path_factory)
    python = sys.executable if IS_016 else _python_016()
    env = engine_env(VLLM_MLA_DISABLE="1", OMP_NUM_THREADS="2")
    import time

    t0 = time.time()
    with _run_lock(root):  # the other engine tier may be running or resuming the same run
        recipe = write_tiny_recipe(str(root), **CI_RECIPE)
        r = subprocess.run(
            [python, "-m", "vllm_k2_plugin.cli", "train", "run", recipe],
            env=env,
            capture_output=True,
            text=True,
            timeout=2400,
        )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    work = root / "work"
    (root / "pipeline-seconds.txt").write_text(f"{time.time() - t0:.0f}\n")
    return {"root": root, "work": work, "target": str(root / "target"), "log": r.stdout + r.stderr}


@pytest.mark.vllm016
def test_pipeline_stages_on_016(pipeline):
    work = pipeline["work"]
    for stage in ("prepare", "prepare_eval", "extract", "extract_eval", "vocab", "train", "export", "eval"):
        assert (work / stage / "stage.json").exists(), stage
    prep = json.loads((work / "prepare" / "prepare.json").read_text())
    assert prep["regenerated_by"] and prep["masked_tokens"] > 0
    meta = json.loads((work / "extract" / "manifest.json").read_text())["metadata"]
    assert meta["layer_ids"] == [2, 4, 5] and meta["final"].startswith("post-norm")
    vocab = json.loads((work / "vocab" / "vocab.json").read_text())
    assert vocab["coverage"] > 0.99, vocab  # 768 of 1024 ids cover the code answers
    metrics = [json.loads(x) for x in (work / "train" / "metrics.jsonl").read_text().splitlines()]
    first, last = metrics[0], metrics[-1]
    assert [m["step"] for m in metrics] == list(range(1, len(metrics) + 1))
    assert last["loss"] < 0.5 * first["loss"] and last["acc_0"] > 0.6, (first, last)
    ev = json.loads((work / "eval" / "eval.json").read_text())
    assert (work / "eval" / "acceptance.png").stat().st_size > 1000
    pp = ev["per_position_acceptance"]
    assert all(a >= b for a, b in zip(pp, pp[1:], strict=False))  # P(first j accepted) cannot rise
    assert ev["tau"]["3"] >= TAU3_OFFLINE_FLOOR, ev


@pytest.mark.vllm_latest
def test_rerun_skips_finished_stages(pipeline):
    """`train run` of a finished recipe redoes nothing. In CI this tier's fixture is that second
    run (the 0.16 tier ran the recipe first): its output is the proof; else the recipe runs again."""
    stages = ("prepare", "extract", "train", "export", "eval")
    out = pipeline["log"]
    if not all(f"[{stage}] done already" in out for stage in stages):
        with _run_lock(pipeline["root"]):
            r = subprocess.run(
                [_python_016(), "-m", "vllm_k2_plugin.cli", "train", "run", str(pipeline["root"] / "recipe.toml")],
                env=engine_env(VLLM_MLA_DISABLE="1", OMP_NUM_THREADS="2"),
                capture_output=True,
                text=True,
                timeout=600,
            )
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.stdout
    for stage in stages:
        assert f"[{stage}] done already" in out, out[-3000:]
    # nothing to regenerate: no vLLM server started (a resumed run of a 1T target would load it)
    assert "starting a vLLM server" not in out, out[-3000:]


def _heldout_prompts(work: Path, target: str) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    chats = [json.loads(x)["messages"] for x in (work / "prepare_eval" / "chats.jsonl").read_text().splitlines()]
    return [tok.apply_chat_template(c[:-1], tokenize=False, add_generation_prompt=True) for c in chats]


def _serve_heldout(pipeline, drafter: Path, out: Path, env: dict, **spec) -> dict:
    """The held-out prompts' greedy decoding with EAGLE-3 k = 3 and that drafter, vLLM's
    metrics read (a fixed k: the speculation guard could pick another)."""
    job = {
        "model": pipeline["target"],
        "prompts": _heldout_prompts(pipeline["work"], pipeline["target"]),
        "max_tokens": 96,
        "logprobs": None,
        "metrics": True,
        "llm_kwargs": dict(
            SMALL_ENGINE,
            disable_log_stats=False,
            max_num_seqs=8,
            speculative_config={"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3, **spec},
        ),
    }
    return run_engine_job(out, job, engine_env(VLLM_K2_SPEC_GUARD="0", **env), timeout=900, in_process=True)


@pytest.mark.vllm_latest
def test_exported_drafter_serves_with_eagle3_on_latest(pipeline, tmp_path):
    work = pipeline["work"]
    offline = json.loads((work / "eval" / "eval.json").read_text())
    r = _serve_heldout(pipeline, work / "export", tmp_path / "serve", {"VLLM_MLA_DISABLE": "1"})
    assert r["ok"], r.get("traceback") or r["log"][-4000:]
    m = r["metrics"]
    drafts, accepted = m["vllm:spec_decode_num_drafts"], m["vllm:spec_decode_num_accepted_tokens"]
    tau_vllm = 1 + accepted / drafts
    per_pos = [a / drafts for a in m["vllm:spec_decode_num_accepted_tokens_per_pos"]]
    served = offline["served"]["3"]
    result = {
        "tau_vllm": tau_vllm,
        "per_position_vllm": per_pos,
        "drafts_vllm": drafts,
        "tau_offline_served": served["tau"],
        "per_position_offline_served": served["per_position"],
        "drafts_offline_served": served["drafts"],
        "tau_offline_all_positions": offline["tau"]["3"],
    }
    (pipeline["root"] / "serve-latest.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    assert tau_vllm >= TAU3_VLLM_FLOOR, result
    assert abs(served["tau"] - tau_vllm) / tau_vllm <= AGREEMENT, result


@pytest.fixture(scope="module")
def mla_run(pipeline):
    """The same run's data and vocabulary, a drafter with MLA attention (lightseekorg's layout):
    the stage commands a recipe with ``[train] draft = {attention = "mla"}`` runs, in the 0.16 venv
    (train with the recipe's own [train] settings, export in its default layout, offline eval)."""
    root, work, model = pipeline["root"], pipeline["work"], pipeline["target"]
    out = root / "mla"
    with _run_lock(root):
        _train_mla(root, work, model, out)
    return {"dir": out, "eval": json.loads((out / "eval" / "eval.json").read_text())}


def _train_mla(root: Path, work: Path, model: str, out: Path) -> None:
    from vllm_k2_tools.train.recipe import load_recipe, torchrun_command

    if not (out / "eval" / "eval.json").exists():
        tr = dict(load_recipe(str(root / "recipe.toml"))["train"])
        tr.pop("nproc", None)
        draft = {**(tr.pop("draft", None) or {}), "attention": "mla"}
        python = sys.executable if IS_016 else _python_016()
        train = torchrun_command(
            model,
            {"extract": str(work / "extract"), "vocab": str(work / "vocab"), "train": str(out / "train")},
            tr,
            draft,
            1,
        )
        cli = [python, "-m", "vllm_k2_plugin.cli", "train"]
        for cmd in (
            [python, *train[1:]],
            [*cli, "export", "--run", str(out / "train"), "--target", model, "--out", str(out / "export")],
            [*cli, "eval", "--draft", str(out / "export"), "--target", model]
            + ["--extracted", str(work / "extract_eval"), "--out", str(out / "eval")],
        ):
            r = subprocess.run(cmd, env=engine_env(OMP_NUM_THREADS="2"), capture_output=True, text=True, timeout=1800)
            assert r.returncode == 0, (cmd[3:6], r.stdout[-2000:] + r.stderr[-4000:])


@pytest.mark.vllm016
def test_an_mla_drafter_trains_on_the_same_data_as_well(pipeline, mla_run):
    """The MLA drafter of the same recipe (same data, settings and vocabulary) reaches the
    Llama-layer drafter's offline tau(3) within 5 %, and exports in the MLA layout."""
    cfg = json.loads((mla_run["dir"] / "export" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"], cfg["architectures"]
    metrics = [json.loads(x) for x in (mla_run["dir"] / "train" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["loss"] < 0.5 * metrics[0]["loss"], (metrics[0], metrics[-1])
    llama = json.loads((pipeline["work"] / "eval" / "eval.json").read_text())
    tau_mla, tau_llama = mla_run["eval"]["tau"]["3"], llama["tau"]["3"]
    (pipeline["root"] / "mla-vs-llama.json").write_text(json.dumps({"tau3_mla": tau_mla, "tau3_llama": tau_llama}))
    assert tau_mla >= 0.95 * tau_llama, (tau_mla, tau_llama)


@pytest.mark.vllm_latest
def test_the_trained_mla_drafter_drafts_in_vllm_as_trained(pipeline, mla_run, tmp_path):
    """vLLM's own MLA drafter class serves the export (MLA on, target and drafter) with the
    acceptance the offline eval predicts for greedy decoding's draft positions: the trainer's
    MLA layer computes what vLLM's does."""
    # the drafter's MLA on the reference CPU MLA, as the target's (where the engine picks one)
    backend = {"attention_backend": SMALL_ENGINE["attention_backend"]} if "attention_backend" in SMALL_ENGINE else {}
    r = _serve_heldout(pipeline, mla_run["dir"] / "export", tmp_path / "serve", {}, **backend)
    assert r["ok"], r.get("traceback") or r["log"][-4000:]
    assert "Eagle3DeepseekV2ForCausalLM" in r["log"]
    m = r["metrics"]
    tau_vllm = 1 + m["vllm:spec_decode_num_accepted_tokens"] / m["vllm:spec_decode_num_drafts"]
    served = mla_run["eval"]["served"]["3"]
    result = {
        "tau_vllm": tau_vllm,
        "tau_offline_served": served["tau"],
        "drafts_vllm": m["vllm:spec_decode_num_drafts"],
    }
    (pipeline["root"] / "serve-latest-mla.json").write_text(json.dumps(result, indent=1))
    assert abs(served["tau"] - tau_vllm) / tau_vllm <= AGREEMENT, result
