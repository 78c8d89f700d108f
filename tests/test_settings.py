"""Settings are parsed one way: every yes/no VLLM_K2_* variable takes the documented words,
and anything else is an error naming the variable (at register(), or, for a setting a patch
reads, a failed patch that is left wholly unapplied)."""

from __future__ import annotations

import pytest

from vllm_k2_plugin import settings
from vllm_k2_plugin.settings import FALSE_WORDS, TRUE_WORDS, SettingError, Settings, env_flag


@pytest.mark.vllm_independent
def test_the_documented_words_and_the_default(monkeypatch):
    for word in TRUE_WORDS + tuple(w.upper() for w in TRUE_WORDS) + (" on ",):
        monkeypatch.setenv("VLLM_K2_X", word)
        assert env_flag("VLLM_K2_X") is True, word
    for word in FALSE_WORDS + ("OFF",):
        monkeypatch.setenv("VLLM_K2_X", word)
        assert env_flag("VLLM_K2_X", default=True) is False, word
    monkeypatch.setenv("VLLM_K2_X", "")
    assert env_flag("VLLM_K2_X", default=True) is True
    monkeypatch.delenv("VLLM_K2_X")
    assert env_flag("VLLM_K2_X", default=None) is None


@pytest.mark.vllm_independent
@pytest.mark.parametrize(
    "variable, value, read",
    [
        ("VLLM_K2_DISABLE", "2", Settings.from_env),  # was silently "not disabled"
        ("VLLM_K2_STRICT", "strict", Settings.from_env),
        ("VLLM_K2_SPEC_GUARD", "maybe", settings.spec_guard_enabled),  # was "on" for any unknown word
        ("VLLM_K2_DRAFT_GRAPH", "auto", settings.draft_graph_setting),
        ("VLLM_K2_PCIE_ALLREDUCE", "auto", settings.pcie_allreduce_enabled),
        ("VLLM_K2_ANY_MODEL", "llama", settings.any_model),
    ],
)
def test_a_word_outside_the_documented_ones_is_an_error_naming_the_variable(monkeypatch, variable, value, read):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingError, match=f"^{variable}='{value}': expected one of 1, true, yes, on"):
        read()


@pytest.mark.vllm_independent
def test_register_refuses_a_bad_disable_before_touching_vllm(monkeypatch):
    import vllm_k2_plugin
    from vllm_k2_plugin.patching import REGISTRY, PatchState

    monkeypatch.setenv("VLLM_K2_DISABLE", "2")
    before = vllm_k2_plugin._LOADS
    with pytest.raises(SettingError, match="VLLM_K2_DISABLE='2'"):
        vllm_k2_plugin.register()
    assert vllm_k2_plugin._LOADS == before
    assert all(p.state is not PatchState.APPLIED for p in REGISTRY if p.name.startswith("spec-guard"))


@pytest.mark.vllm_latest
def test_a_bad_setting_read_by_a_patch_fails_it_loudly_and_leaves_nothing_applied(monkeypatch, caplog):
    """VLLM_K2_SPEC_GUARD=maybe at engine start: the guard's patches fail, their reason names
    the variable, the line is an error (vLLM's logger tree), and vLLM's scheduler is untouched."""
    import logging

    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY, PatchRegistry, PatchState

    load_feature_patches()
    fresh = PatchRegistry()
    fresh.add(REGISTRY["spec-guard"])
    patch = REGISTRY["spec-guard"]
    saved = (patch.state, patch.reason)
    patch.state, patch.reason = PatchState.PENDING, ""
    stock = Scheduler.schedule
    monkeypatch.setenv("VLLM_K2_SPEC_GUARD", "maybe")
    try:
        with caplog.at_level(logging.ERROR, logger="vllm.k2_plugin"):
            fresh.apply_all()
        assert patch.state is PatchState.FAILED and "VLLM_K2_SPEC_GUARD='maybe'" in patch.reason
        assert Scheduler.schedule is stock
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "vllm.k2_plugin.patching"]
        assert errors and "VLLM_K2_SPEC_GUARD='maybe'" in errors[0].getMessage()
    finally:
        patch.state, patch.reason = saved
