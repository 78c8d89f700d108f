"""The patch contract on toy targets: states, idempotency, refusal, undo, strict mode.

These exercise the mechanism itself; test_plugin_engine.py proves it inside real
vLLM engines.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from vllm_k2_plugin.patching import (
    DoublePatchError,
    Patch,
    PatchRegistry,
    PatchState,
    StrictModeAbort,
)
from vllm_k2_plugin.patching.versions import vllm_version_string


@pytest.fixture
def toy(monkeypatch):
    mod = types.ModuleType("k2_toy_target")

    class Engine:
        def speed(self):
            return 1

    mod.Engine = Engine
    mod.TABLE = {"a": 1}
    monkeypatch.setitem(sys.modules, "k2_toy_target", mod)
    return mod


def make(name, apply, target="k2_toy_target:Engine", **kw):
    fields = dict(
        name=name,
        target=target,
        applies_to=">=0.1",
        why="test",
        upstream="none",
        remove_when="never",
        apply=apply,
    )
    fields.update(kw)
    return Patch(**fields)


def faster(ctx):
    ctx.replace(ctx.target(), "speed", lambda self: 2)


def test_applies_and_records(toy):
    reg = PatchRegistry()
    p = reg.add(make("faster", faster))
    reg.apply_all()
    assert p.state is PatchState.APPLIED
    assert toy.Engine().speed() == 2
    reg.revert_all()
    assert toy.Engine().speed() == 1 and p.state is PatchState.PENDING


def test_second_apply_is_a_noop(toy):
    wraps = []

    def wrap(ctx):
        owner = ctx.target()
        inner = owner.speed
        wraps.append(1)
        ctx.replace(owner, "speed", lambda self: inner(self) + 10)

    reg = PatchRegistry()
    p = reg.add(make("wrap", wrap))
    reg.apply_all()
    reg.apply_all()  # a second register() in the same process
    assert toy.Engine().speed() == 11 and len(wraps) == 1
    # A fresh registry (a second copy of the plugin, a re-import) applying the same
    # patch again must not wrap twice either: the marker on the target says it's ours.
    reg2 = PatchRegistry()
    reg2.add(make("wrap", wrap))
    reg2.apply_all()
    assert toy.Engine().speed() == 11
    assert len(p.replaced) == 1


def test_two_patches_on_one_attribute_are_refused(toy):
    reg = PatchRegistry()
    reg.add(make("first", faster))
    second = reg.add(make("second", lambda ctx: ctx.replace(ctx.target(), "speed", lambda s: 3)))
    reg.apply_all()
    assert toy.Engine().speed() == 2
    assert second.state is PatchState.FAILED
    assert "already patched by 'first'" in second.reason and "'second'" in second.reason


def test_double_patch_error_type(toy):
    from vllm_k2_plugin.patching.patch import PatchContext

    a, b = make("a", faster), make("b", faster)
    PatchContext(a, "x").replace(toy.Engine, "speed", 1)
    with pytest.raises(DoublePatchError):
        PatchContext(b, "x").replace(toy.Engine, "speed", 2)


def boom(ctx):
    ctx.target()
    raise RuntimeError("boom")


def test_failure_names_patch_and_vllm_version(toy):
    reg = PatchRegistry()
    p = reg.add(make("broken", boom))
    reg.apply_all()
    assert p.state is PatchState.FAILED
    assert "'broken'" in p.reason and f"vLLM {vllm_version_string()}" in p.reason and "boom" in p.reason


def test_missing_target_is_not_applicable_never_failed(toy):
    """A target the installed release lacks: not-applicable, naming what is missing."""
    reg = PatchRegistry()
    gone = reg.add(make("moved", faster, target="k2_toy_target:Gone"))
    no_module = reg.add(make("no-module", faster, target="k2_toy_gone_module:Engine"))
    reg.apply_all(strict=True)  # nothing failed: strict mode has nothing to abort for
    assert gone.state is no_module.state is PatchState.NOT_APPLICABLE
    assert f"k2_toy_target:Gone is not in vLLM {vllm_version_string()}" in gone.reason and "'Gone'" in gone.reason
    assert "module k2_toy_gone_module is not in it" in no_module.reason
    assert toy.Engine().speed() == 1


def test_strict_mode_raises_past_except_exception(toy):
    reg = PatchRegistry()
    reg.add(make("broken", boom))
    with pytest.raises(StrictModeAbort, match="broken"):
        try:
            reg.apply_all(strict=True)
        except Exception:  # what vLLM's plugin loader does with plugin errors
            pytest.fail("strict failure was swallowed by `except Exception`")


def test_failed_patch_leaves_nothing_half_applied(toy):
    def half(ctx):
        ctx.replace(ctx.target(), "speed", lambda self: 99)
        ctx.replace_item(toy.TABLE, "b", 2)
        raise RuntimeError("boom after two changes")

    reg = PatchRegistry()
    p = reg.add(make("half", half))
    reg.apply_all()
    assert p.state is PatchState.FAILED and "boom" in p.reason
    assert toy.Engine().speed() == 1 and toy.TABLE == {"a": 1}


def test_retired_when_upstream_has_it(toy):
    reg = PatchRegistry()
    p = reg.add(make("old", faster, already_upstream=lambda: True))
    reg.apply_all()
    assert p.state is PatchState.RETIRED and toy.Engine().speed() == 1


def test_version_range_and_disable(toy):
    reg = PatchRegistry()
    far = reg.add(make("future", faster, applies_to=">=99"))
    off = reg.add(make("off", faster))
    reg.apply_all(disabled=frozenset({"off"}))
    assert far.state is PatchState.NOT_APPLICABLE and "outside >=99" in far.reason
    assert off.state is PatchState.DISABLED
    assert toy.Engine().speed() == 1


def test_range_end_says_why(toy):
    reg = PatchRegistry()
    ended = reg.add(make("ended", faster, applies_to=">=0.1,<0.2", why_range_ends="its target left in 0.2"))
    early = reg.add(make("early", faster, applies_to=">=99,<100", why_range_ends="never shown below the range"))
    reg.apply_all()
    assert ended.reason == f"vLLM {vllm_version_string()} is outside >=0.1,<0.2: its target left in 0.2"
    assert early.reason == f"vLLM {vllm_version_string()} is outside >=99,<100"


def _runner(monkeypatch, runner):
    from vllm_k2_plugin.patching import registry
    from vllm_k2_plugin.patching.runner import RunnerChoice

    monkeypatch.setattr(registry, "model_runner_for_kimi", lambda: RunnerChoice(runner, "the test says so"))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_runners_patch_applies_only_where_the_engine_runs_it(toy, monkeypatch, runner):
    _runner(monkeypatch, runner)
    reg = PatchRegistry()
    v1 = reg.add(make("v1-only", faster, model_runner="v1"))
    anywhere = reg.add(make("anywhere", lambda ctx: ctx.replace_item(toy.TABLE, "k", 5)))
    reg.apply_all()
    assert anywhere.state is PatchState.APPLIED
    if runner == "v1":
        assert v1.state is PatchState.APPLIED
    else:
        assert v1.state is PatchState.NOT_APPLICABLE and toy.Engine().speed() == 1
        assert v1.reason == (
            "built for vLLM's v1 model runner; this engine will use Model Runner V2 (the test says so)"
        )


@pytest.mark.parametrize("missing", ["failed", "not-applicable"])
def test_a_whole_feature_goes_off_with_any_missing_part(toy, missing):
    reg = PatchRegistry()
    first = reg.add(make("part-a", faster, feature="guard", needs_whole_feature=True))
    table = reg.add(make("part-b", lambda ctx: ctx.replace_item(toy.TABLE, "k", 5), feature="guard"))
    if missing == "failed":
        gone = reg.add(make("part-c", boom, feature="guard", needs_whole_feature=True))
    else:
        gone = reg.add(make("part-c", faster, feature="guard", needs_whole_feature=True, only_if=lambda: "not here"))
    other = reg.add(make("other", lambda ctx: ctx.replace_item(toy.TABLE, "o", 1), feature="elsewhere"))
    reg.apply_all()
    assert gone.state.value == missing
    for part in (first, table):
        assert part.state is PatchState.NOT_APPLICABLE
        assert part.reason == f"feature guard incomplete: part-c {missing}"
    assert toy.Engine().speed() == 1 and "k" not in toy.TABLE  # undone
    assert other.state is PatchState.APPLIED and toy.TABLE["o"] == 1  # other features keep theirs


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_feature_with_parts_per_runner_is_whole_on_either(toy, monkeypatch, runner):
    """The other runner's parts are not missing parts: the feature acts with its own runner's.
    (Keys of their own: the registry marks a dict by its id, which a new toy may reuse.)"""
    _runner(monkeypatch, runner)
    reg = PatchRegistry()
    shared = reg.add(make("shared", lambda ctx: ctx.replace_item(toy.TABLE, "shared", 5), feature="guard"))
    v1 = reg.add(make("v1-part", faster, feature="guard", needs_whole_feature=True, model_runner="v1"))
    v2 = reg.add(make("v2-part", lambda ctx: ctx.replace_item(toy.TABLE, "v2", 1), feature="guard", model_runner="v2"))
    reg.apply_all()
    assert shared.state is PatchState.APPLIED and toy.TABLE["shared"] == 5
    mine, theirs = (v1, v2) if runner == "v1" else (v2, v1)
    assert mine.state is PatchState.APPLIED
    assert theirs.state is PatchState.NOT_APPLICABLE and theirs.reason.startswith("built for")


def test_a_feature_without_parts_for_this_runner_is_off(toy, monkeypatch):
    """Runner-bound parts only for the other runner: the runner-free part does not act alone."""
    _runner(monkeypatch, "v2")
    reg = PatchRegistry()
    shared = reg.add(make("shared", lambda ctx: ctx.replace_item(toy.TABLE, "shared", 5), feature="guard"))
    v1 = reg.add(make("v1-part", faster, feature="guard", needs_whole_feature=True, model_runner="v1"))
    reg.apply_all()
    assert v1.state is PatchState.NOT_APPLICABLE
    assert shared.state is PatchState.NOT_APPLICABLE and "shared" not in toy.TABLE
    assert shared.reason == "feature guard incomplete: v1-part not-applicable"


def test_a_part_switched_off_by_name_leaves_the_rest_on(toy):
    """VLLM_K2_DISABLE_PATCHES measures a feature without one part: the rest stays."""
    reg = PatchRegistry()
    first = reg.add(make("part-a", faster, feature="guard", needs_whole_feature=True))
    off = reg.add(make("part-b", boom, feature="guard", needs_whole_feature=True))
    reg.apply_all(disabled=frozenset({"part-b"}))
    assert off.state is PatchState.DISABLED and first.state is PatchState.APPLIED


def test_mapping_items(toy):
    reg = PatchRegistry()
    p = reg.add(make("table", lambda ctx: ctx.replace_item(toy.TABLE, "k", 5)))
    reg.apply_all()
    assert toy.TABLE == {"a": 1, "k": 5}
    reg.remove("table")
    assert toy.TABLE == {"a": 1} and p.replaced == []


def test_duplicate_names_rejected():
    reg = PatchRegistry()
    reg.add(make("x", faster))
    with pytest.raises(ValueError, match="two patches are named 'x'"):
        reg.add(make("x", lambda ctx: None))


def test_wrap_links_the_original_checks_and_reverts(toy):
    original = toy.Engine.speed

    def doubled(orig):
        def speed(self):
            return 2 * orig(self)

        return speed

    seen = []
    reg = PatchRegistry()
    p = reg.add(make("doubled", lambda ctx: ctx.wrap(ctx.target(), "speed", doubled, check=seen.append)))
    reg.apply_all()
    assert p.state is PatchState.APPLIED and toy.Engine().speed() == 2
    assert toy.Engine.speed.__wrapped__ is original and toy.Engine.speed.__qualname__ == original.__qualname__
    assert seen == [toy.Engine.speed]  # the check saw the wrapper before it was installed
    reg.apply_all()  # idempotent: never a wrapper around our wrapper
    assert toy.Engine().speed() == 2
    reg.revert_all()
    assert toy.Engine.speed is original


def test_replaced_classmethod_is_restored_as_a_classmethod(toy):
    class Base:
        @classmethod
        def kind(cls):
            return cls.__name__

    class Child(Base):
        pass

    toy.Base = Base
    reg = PatchRegistry()
    reg.add(
        make(
            "kind",
            lambda ctx: ctx.replace(Base, "kind", classmethod(lambda cls: "patched")),
            target="k2_toy_target:Base",
        )
    )
    reg.apply_all()
    assert Child.kind() == "patched"
    reg.revert_all()
    assert Child.kind() == "Child"  # bound to the subclass again, not to Base


def test_wrapped_classmethod_and_staticmethod_keep_their_kind(toy):
    class Base:
        @classmethod
        def kind(cls):
            return cls.__name__

        @staticmethod
        def double(x):
            return 2 * x

    class Child(Base):
        pass

    toy.Base = Base
    seen, original_kind = [], vars(Base)["kind"].__func__

    def wrap_kind(original):
        def kind(cls):
            return "wrapped " + original(cls)

        return kind

    def apply(ctx):
        ctx.wrap(Base, "kind", wrap_kind, check=seen.append)
        ctx.wrap(Base, "double", lambda original: lambda x: original(x) + 1)

    reg = PatchRegistry()
    reg.add(make("kinds", apply, target="k2_toy_target:Base"))
    reg.apply_all()
    assert Child.kind() == "wrapped Child" and Base().kind() == "wrapped Base"
    assert Child.double(3) == 7 and Base().double(3) == 7
    assert seen[0].__wrapped__ is original_kind  # check() saw the function, wrapped like any other
    reg.apply_all()  # a second apply in the same process: no double wrap
    assert Child.kind() == "wrapped Child"
    reg.revert_all()
    assert Child.kind() == "Child" and Base.double(3) == 6


def test_wrap_check_refusal_installs_nothing(toy):
    def refuse(wrapper):
        raise RuntimeError("wrapper does not behave")

    reg = PatchRegistry()
    p = reg.add(make("refused", lambda ctx: ctx.wrap(ctx.target(), "speed", lambda o: lambda self: 5, check=refuse)))
    reg.apply_all()
    assert p.state is PatchState.FAILED and "does not behave" in p.reason
    assert toy.Engine().speed() == 1


def test_readme_patch_table_lists_every_registered_patch():
    """The README's table is the user's list of what the plugin changes: one row per
    registered patch, no row for a patch that does not exist."""
    import re

    import vllm_k2_plugin
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    loads = vllm_k2_plugin._LOADS
    load_feature_patches()
    assert vllm_k2_plugin._LOADS == loads, "importing the feature modules must not run register()"
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## What the plugin does today", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([a-z0-9.-]+)` \|", section, flags=re.M))
    assert rows == {p.name for p in REGISTRY}


def test_a_process_that_ran_register_can_still_fork_an_engine_core(tmp_path):
    """vLLM runs register() in its API-server / LLM process and, on a CUDA machine, forks its
    engine core from it. On the vLLM 0.16 CPU engine a probe of ours runs a torch op big enough
    to start GNU OpenMP's workers there, and a forked child then hangs at its first large CPU
    buffer, where vLLM 0.16 engines on an H100 hung (stacks in benchmarks/results/spec_guard_gpu/;
    which check started the threads on that GPU was not read). register() keeps torch on one
    thread; the job forks through vLLM's own start-method choice and allocates with vLLM's own
    buffer class, and a child that hangs is killed after 60 s."""
    import json
    import subprocess

    from .conftest import REPO, engine_env

    result_path = tmp_path / "result.json"
    env = engine_env()
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)  # vLLM's default (fork), as on a CUDA machine
    subprocess.run(
        [sys.executable, str(REPO / "tests" / "fork_engine_core_job.py"), "register", str(result_path)],
        env=env,
        timeout=240,
        check=True,
    )
    result = json.loads(result_path.read_text())
    assert result["method"] == "fork", result  # vLLM's CUDA-machine path, or this proves nothing
    assert result["child"] == "ok", f"the engine core hung after register(); threads started by {result}"


def test_the_drafter_check_keeps_torch_on_one_thread(monkeypatch):
    """The drafter check runs while vLLM builds the speculative config, in the process it then
    forks its engine from; its d2t check's ops over a K2.5 drafter's draft vocabulary (32,000
    entries and up) can be big enough to start torch's OpenMP workers, which a forked engine
    would deadlock on. The config hook runs its checks, and vLLM's own config code, on one torch
    thread and gives the count back after. Both checks are stood in for by recorders of the
    thread count (the real ones need a drafter on disk)."""
    from types import SimpleNamespace

    import torch

    from vllm_k2_plugin.models import eagle3_preflight as pf

    seen = []
    monkeypatch.setattr(pf, "resolve_draft", lambda path, revision=None: path)
    monkeypatch.setattr(pf, "check_drafter_class", lambda draft_dir: seen.append(("class", torch.get_num_threads())))
    monkeypatch.setattr(pf, "preflight", lambda *args: seen.append(("preflight", torch.get_num_threads())))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        hook = pf._wrap(lambda self, *args, **kwargs: seen.append(("vllm", torch.get_num_threads())) or "spec")
        engine_args = SimpleNamespace(speculative_config={"method": "eagle3", "model": "drafter"}, load_format=None)
        assert hook(engine_args, None, None) == "spec"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [("class", 1), ("vllm", 1), ("preflight", 1)]
