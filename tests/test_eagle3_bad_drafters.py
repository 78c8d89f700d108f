"""Broken drafters fail before serving, with errors that name the file and the
field or tensor: offline (vllm-k2 eagle3 check) and inside vLLM's own config path."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

from vllm_k2_plugin.models.eagle3_checks import DraftCheckError, TargetShape, check_draft
from vllm_k2_tools.fixtures import build_draft

from .conftest import engine_env
from .test_eagle3_spec import _config_jobs


def _mutate(src, dst, config=None, tensors=None):
    shutil.copytree(src, dst)
    if config:
        cfg = json.load(open(os.path.join(dst, "config.json")))
        config(cfg)
        json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    if tensors:
        path = os.path.join(dst, "model.safetensors")
        t = load_file(path)
        tensors(t)
        save_file(t, path)
    return dst


def _drop_d2t(t):
    del t["d2t"]


def _d2t_out_of_range(t):
    t["d2t"][-1] += 10_000


def _d2t_float(t):
    t["d2t"] = t["d2t"].float()


def _d2t_duplicate(t):
    t["d2t"][1] = t["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id


def _fc_wrong(t):
    t["fc.weight"] = t["fc.weight"][:, :512].contiguous()


def _set(path, value):
    def f(cfg):
        node = cfg
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value

    return f


CASES = {
    "d2t missing": (None, _drop_d2t, "tensor 'd2t' is missing"),
    "d2t out of range": (None, _d2t_out_of_range, "tensor 'd2t' maps draft ids outside"),
    "d2t not integer": (None, _d2t_float, "tensor 'd2t' must be a 1-D integer tensor"),
    "d2t not injective": (None, _d2t_duplicate, "tensor 'd2t' maps two draft ids to the same"),
    "fc shape": (None, _fc_wrong, "tensor 'fc.weight' has shape [256, 512]"),
    "vocab mismatch": (_set("vocab_size", 2048), None, "field 'vocab_size' is 2048"),
    "target hidden mismatch": (_set("target_hidden_size", 512), None, "field 'target_hidden_size' is 512"),
    "aux count": (_set("eagle_config.eagle_aux_hidden_state_layer_ids", [2, 4]), None, "lists 2 layers"),
    "aux out of range": (
        _set("eagle_config.eagle_aux_hidden_state_layer_ids", [2, 4, 99]),
        None,
        "has ids [99] outside 0..8",
    ),
}


@pytest.fixture(scope="module")
def bad_drafters(k25_model, fixture_root):
    good = build_draft("legacy", str(fixture_root / "draft-legacy-src"), k25_model)
    out = {}
    for name, (cfg, tensors, expect) in CASES.items():
        dst = str(fixture_root / ("bad-" + name.replace(" ", "-")))
        if not os.path.exists(dst):
            _mutate(good, dst, cfg, tensors)
        out[name] = (dst, expect)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_offline_check_names_file_and_field(bad_drafters, k25_model, case):
    path, expect = bad_drafters[case]
    with pytest.raises(DraftCheckError) as e:
        check_draft(path, TargetShape.from_config_file(k25_model))
    assert expect in str(e.value)
    assert path in str(e.value), "the error names the drafter's file or directory"


@pytest.mark.slow
def test_vllm_config_path_rejects_bad_drafters(bad_drafters, k25_model, tmp_path):
    """Preflight inside EngineArgs.create_speculative_config, in vLLM's own process
    0, before any engine starts: same errors, on this engine's vLLM."""
    chosen = ["d2t out of range", "aux out of range", "vocab mismatch"]
    dirs = [bad_drafters[c][0] for c in chosen]
    results = _config_jobs(k25_model, dirs, tmp_path, engine_env(), load_draft=False)
    for case, path in zip(chosen, dirs, strict=True):
        r = results[path]
        assert not r["ok"], case
        assert r["error_type"] == "DraftCheckError", (case, r.get("traceback"))
        assert bad_drafters[case][1] in r["error"] and path in r["error"]


def test_missing_or_broken_directories_name_the_path_and_what_was_expected(k25_model, fixture_root, tmp_path):
    """A missing target directory is not "a drafter needs config.json": every message names the
    path it was given, what it was given as, and what it expected there."""
    good = build_draft("legacy", str(fixture_root / "draft-legacy-src"), k25_model)
    gone = str(tmp_path / "no-such-target")
    with pytest.raises(DraftCheckError) as e:
        TargetShape.from_config_file(gone)
    assert str(e.value) == f"{gone}: not a directory (expected the target model's directory, with its config.json)"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DraftCheckError, match="the target model directory .*empty needs a config.json") as e:
        TargetShape.from_config_file(str(empty))
    assert str(empty / "config.json") in str(e.value)
    with pytest.raises(DraftCheckError, match="the EAGLE-3 drafter directory .*empty needs a config.json"):
        check_draft(str(empty), TargetShape.from_config_file(k25_model))
    with pytest.raises(DraftCheckError, match="expected the EAGLE-3 drafter's directory"):
        check_draft(str(tmp_path / "no-such-drafter"), TargetShape.from_config_file(k25_model))
    (empty / "config.json").write_text("[1, 2]")
    with pytest.raises(DraftCheckError, match="the target model's config must be a JSON object, got list"):
        TargetShape.from_config_file(str(empty))
    (empty / "config.json").write_text('{"hidden_size": 8, "vocab_size": 16}')
    with pytest.raises(DraftCheckError, match="the target model's field 'num_hidden_layers' is missing"):
        TargetShape.from_config_file(str(empty))
    (empty / "config.json").write_text("{")
    with pytest.raises(DraftCheckError, match="invalid JSON in the target model's config"):
        TargetShape.from_config_file(str(empty))
    no_weights = tmp_path / "config-only"
    no_weights.mkdir()
    shutil.copy(os.path.join(good, "config.json"), no_weights)
    with pytest.raises(DraftCheckError) as e:
        check_draft(str(no_weights), TargetShape.from_config_file(k25_model))
    assert str(e.value) == f"{no_weights}: no *.safetensors file (expected the EAGLE-3 drafter's weights there)"


def test_good_drafter_passes_offline(k25_model, fixture_root):
    good = build_draft("legacy", str(fixture_root / "draft-legacy-src"), k25_model)
    s = check_draft(good, TargetShape.from_config_file(k25_model))
    assert s.draft_vocab_size == 768 and s.aux_layer_ids == (2, 4, 8)


@pytest.mark.slow
def test_config_only_drafter_passes_preflight_with_dummy_weights(k25_model, fixture_root, tmp_path):
    """load_format="dummy" (benchmarks at full size without weight files): the drafter's
    config is still checked, its missing weight files are not an error; with real loading
    they are, by name."""
    good = build_draft("legacy", str(fixture_root / "draft-legacy-src"), k25_model)
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(os.path.join(good, "config.json"), bare / "config.json")
    (tmp_path / "d").mkdir()
    (tmp_path / "r").mkdir()
    dummy = _config_jobs(k25_model, [str(bare)], tmp_path / "d", engine_env(), load_draft=False, load_format="dummy")
    real = _config_jobs(k25_model, [str(bare)], tmp_path / "r", engine_env(), load_draft=False)
    assert dummy[str(bare)]["ok"], dummy[str(bare)].get("traceback")
    r = real[str(bare)]
    assert not r["ok"] and r["error_type"] == "DraftCheckError" and "no *.safetensors" in r["error"], r


def _hf_cache_entry(cache, repo_id, src):
    """A drafter placed in a Hugging Face hub cache the way huggingface_hub lays one out."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(src, repo / "snapshots" / commit)
    return repo / "snapshots" / commit


@pytest.mark.slow
def test_hub_id_drafters_are_resolved_through_the_cache_and_checked(bad_drafters, k25_model, fixture_root, tmp_path):
    cache = tmp_path / "hub"
    good = build_draft("legacy", str(fixture_root / "draft-legacy-src"), k25_model)
    _hf_cache_entry(cache, "local/k25-eagle3", good)
    bad_path, bad_why = bad_drafters["d2t out of range"]
    cached_bad = _hf_cache_entry(cache, "local/bad-eagle3", bad_path)
    env = engine_env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "hf-home"))
    ids = ["local/k25-eagle3", "local/bad-eagle3", "nobody/missing-eagle3"]
    r = _config_jobs(k25_model, ids, tmp_path, env, load_draft=False)
    assert r["local/k25-eagle3"]["ok"], r["local/k25-eagle3"].get("traceback")
    bad = r["local/bad-eagle3"]
    assert bad["error_type"] == "DraftCheckError" and bad_why in bad["error"] and str(cached_bad) in bad["error"], bad
    missing = r["nobody/missing-eagle3"]
    assert missing["error_type"] == "DraftCheckError", missing
    assert "'nobody/missing-eagle3'" in missing["error"] and "local Hugging Face cache" in missing["error"]
