"""Let `--speculative-config '{"method": "eagle3", ...}'` accept DeepSeek/Kimi targets.

vLLM 0.16's ``SpeculativeConfig._verify_args`` (a pydantic ``model_validator``)
rejects EAGLE-3 unless the target's ``hf_text_config.model_type`` contains one of
``("llama", "qwen", ...)``. Upstream removed the list (vllm-project/vllm#42536).

Why bytecode: pydantic compiled the validator into ``__pydantic_validator__``;
replacing the attribute or subclassing does not reach it (vLLM re-validates nested
configs with the base validator). The function object pydantic calls is the one in
``__pydantic_decorators__``, and the list is one constant tuple in its code object:
we extend that tuple in place. The patch refuses to act unless it finds exactly
that tuple, so a changed vLLM fails by name instead of silently. The clean form of
the same change is patches/vllm-0.16.0/0005-eagle3-target-allowlist.patch.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext

#: Substrings matched against the target's text model_type (as vLLM does).
K2_TARGETS = ("deepseek", "kimi")
_MARKERS = ("llama", "qwen", "gpt_oss")


def _validator():
    from vllm.config.speculative import SpeculativeConfig

    decorators = SpeculativeConfig.__pydantic_decorators__.model_validators
    if "_verify_args" not in decorators:
        return None
    func = decorators["_verify_args"].func
    return getattr(func, "__func__", func)


def _allow_lists(func) -> list[tuple]:
    return [c for c in func.__code__.co_consts if isinstance(c, tuple) and all(m in c for m in _MARKERS)]


def _no_allowlist_or_has_k2() -> bool:
    func = _validator()
    if func is None:
        return True
    lists = _allow_lists(func)
    return not lists or all(all(t in c for t in K2_TARGETS) for c in lists)


@REGISTRY.patch(
    name="eagle3-target-allowlist",
    feature="eagle3",
    target="vllm.config.speculative:SpeculativeConfig._verify_args",
    applies_to=">=0.16,<0.18",
    why_range_ends="vLLM 0.18 dropped the EAGLE-3 target allow-list (vllm-project/vllm#42536)",
    already_upstream=_no_allowlist_or_has_k2,
    upstream="vllm-project/vllm#42536 (allow-list removed upstream)",
    why="stock 0.16 refuses method=eagle3 for deepseek_v3/kimi_k2 targets at config time",
    remove_when="minimum supported vLLM >= 0.18",
    patch_file="0005-eagle3-target-allowlist.patch",
)
def _apply(ctx: PatchContext) -> None:
    import sys

    ctx.target()
    func = _validator()
    if func is None:
        raise ctx.fail("SpeculativeConfig has no _verify_args model validator")
    consts = list(func.__code__.co_consts)
    hits = [i for i, c in enumerate(consts) if isinstance(c, tuple) and all(m in c for m in _MARKERS)]
    if len(hits) != 1:
        raise ctx.fail(
            f"expected one EAGLE-3 allow-list tuple in _verify_args' constants under Python "
            f"{sys.version_info.major}.{sys.version_info.minor}, found {len(hits)}; "
            "apply patches/vllm-0.16.0/0005-eagle3-target-allowlist.patch instead"
        )
    i = hits[0]
    consts[i] = consts[i] + tuple(t for t in K2_TARGETS if t not in consts[i])
    new_code = func.__code__.replace(co_consts=tuple(consts))
    ctx.replace(func, "__code__", new_code)
