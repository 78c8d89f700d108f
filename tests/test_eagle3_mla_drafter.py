"""MLA EAGLE-3 drafters (lightseekorg/kimi-k2.5-eagle3-mla's layout: one DeepSeek MLA layer,
``Eagle3DeepseekV2ForCausalLM``): recognised by the drafter check, and refused with an error
naming the field on a vLLM that has no class for them (0.16: vLLM added it in 0.18), instead
of vLLM's list of every architecture it knows. Where vLLM has the class (the latest engine),
our check lets it through."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from vllm_k2_plugin.models.eagle3_checks import DraftCheckError, TargetShape, check_draft
from vllm_k2_tools.fixtures import build_draft

from .conftest import IS_016

#: the fields an MLA layer reads (DeepSeek-V3 names), scaled down to the tiny target
MLA_FIELDS = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
}


@pytest.fixture(scope="module")
def mla_draft(k25_model, fixture_root) -> str:
    src = build_draft("legacy", str(fixture_root / "draft-legacy-for-mla"), k25_model)
    dst = fixture_root / "draft-mla"
    if not dst.exists():
        shutil.copytree(src, dst)
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg.update(MLA_FIELDS)
        with open(path, "w") as f:
            json.dump(cfg, f)
    return str(dst)


def test_the_check_names_the_layout_and_architecture(mla_draft, k25_model):
    summary = check_draft(mla_draft, TargetShape.from_config_file(k25_model))
    assert summary.layout == "mla"
    assert summary.architecture == "Eagle3DeepseekV2ForCausalLM"


def test_refused_with_the_field_named_where_vllm_has_no_class(mla_draft):
    from vllm_k2_plugin.models.eagle3_preflight import check_drafter_class

    if IS_016:
        with pytest.raises(DraftCheckError) as e:
            check_drafter_class(mla_draft)
        msg = str(e.value)
        assert "config.json: field 'architectures'" in msg and "from 0.18 on" in msg, msg
    else:
        check_drafter_class(mla_draft)  # vLLM builds it: nothing of ours stands in the way


def test_a_llama_style_drafter_is_never_refused(k25_model, fixture_root):
    from vllm_k2_plugin.models.eagle3_preflight import check_drafter_class

    check_drafter_class(build_draft("legacy", str(fixture_root / "draft-legacy-for-mla"), k25_model))
