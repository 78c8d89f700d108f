"""The GGUF loader for DeepSeek-MLA GGUFs (Kimi-K2 / K2.5 / DeepSeek-V3) on vLLM's
in-tree GGUF support: force-dequant, MLA reassembly, kimi types, shards, audit.

Force-dequant is configured through vLLM's own ``--model-loader-extra-config``
(``{"force_dequant": "all" | ["glob", ...]}``, globs over GGUF or HF tensor names)
or the env var VLLM_K2_GGUF_FORCE_DEQUANT (comma-separated globs or ``all``). The
MLA attention tensors MLA absorbs (``attn_k_b``/``attn_v_b`` or ``attn_kv_b`` ->
``kv_b_proj``) are always dequantized. Dequantization streams: one tensor at a time
from the memory-mapped file, to the model dtype.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from .files import KERNEL_TYPES, UNQUANTIZED, GGUFLoadError, Tensor, dequantize, discover_shards, open_shards
from .mla_layout import merge_kv_b
from .names import DEEPSEEK2_TYPES, IGNORED, NameMap, deepseek2_name_map

#: same name as vllm_k2_plugin.settings.ENV_GGUF_FORCE_DEQUANT (kept literal: this module is
#: also rendered into vLLM's source tree by upstream.py)
ENV_FORCE = "VLLM_K2_GGUF_FORCE_DEQUANT"
OPTION_HINT = """--model-loader-extra-config '{"force_dequant": ["%s"]}' (or "all")"""
#: fused vLLM modules whose GGUF parts must share one precision
PACKED = (
    ("attn_q_a", "attn_kv_a_mqa"),
    ("ffn_gate", "ffn_up"),
    ("ffn_gate_shexp", "ffn_up_shexp"),
    ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
)


@dataclass
class Options:
    force: list[str] = field(default_factory=list)  # globs; ["*"] for all

    @classmethod
    def parse(cls, extra: dict | None) -> Options:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - {"force_dequant"})
        if unknown:
            raise GGUFLoadError(f"--model-loader-extra-config: unknown keys {unknown} (known: force_dequant)")
        value = extra.get("force_dequant", os.environ.get(ENV_FORCE, ""))
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise GGUFLoadError(f"force_dequant must be 'all' or a list of globs, got {value!r}")
        return cls(force=["*"] if value == ["all"] else value)

    def wants(self, *names: str) -> bool:
        return any(fnmatch.fnmatchcase(n, pat) for n in names for pat in self.force)


@dataclass
class Plan:
    tensors: dict[str, Tensor]
    names: NameMap
    dequant: set[str]  # gguf names dequantized at load
    tie_embeddings: bool

    def unquantized_modules(self) -> list[str]:
        out = set()
        for gg, t in self.tensors.items():
            if gg in self.dequant or t.qtype in UNQUANTIZED:
                hf = self.names.direct.get(gg)
                if hf:
                    out.add(hf.rsplit(".", 1)[0])
                elif gg in self.names.experts:
                    out.add(self.names.experts[gg][0].split(".{e}.")[0])  # the FusedMoE module
        out |= {hf.rsplit(".", 1)[0] for hf in self.names.kv_b.values()}
        return sorted(out)


def _is_kv_b_part(gguf_name: str) -> bool:
    parts = gguf_name.split(".")
    return len(parts) > 2 and parts[2] in ("attn_kv_b", "attn_k_b", "attn_v_b")


def _kv_b_parts(i: int) -> tuple[str, str, str]:
    return f"blk.{i}.attn_kv_b.weight", f"blk.{i}.attn_k_b.weight", f"blk.{i}.attn_v_b.weight"


def make_plan(shards: list[str], names: NameMap, options: Options, on_cpu: bool) -> Plan:
    tensors = open_shards(shards)
    known = set(names.direct) | set(names.experts)
    for i in names.kv_b:
        known |= set(_kv_b_parts(i))
    stray = sorted(n for n in tensors if n not in known and not IGNORED.match(n))
    if stray:
        raise GGUFLoadError(f"{shards[0]}: GGUF tensors not used by the model (audit): {stray}")
    missing = sorted(g for g in list(names.direct) + list(names.experts) if g not in tensors and g != "output.weight")
    for i in names.kv_b:
        kv, kb, vb = _kv_b_parts(i)
        if kv not in tensors and not (kb in tensors and vb in tensors):
            missing.append(f"{kv} (or {kb} + {vb})")
    if missing:
        raise GGUFLoadError(f"{shards[0]}: model tensors missing from the GGUF (audit): {missing}")

    dequant = set()
    for gg, t in tensors.items():
        hf = names.direct.get(gg) or (names.experts[gg][0] if gg in names.experts else "")
        if _is_kv_b_part(gg):
            dequant.add(gg)  # MLA absorbs kv_b: always dense
        elif t.qtype not in UNQUANTIZED and options.wants(gg, hf):
            dequant.add(gg)
    _close_packed_groups(tensors, names, dequant)
    for gg, t in sorted(tensors.items()):
        if t.qtype in UNQUANTIZED or gg in dequant:
            continue
        if on_cpu:
            raise GGUFLoadError(
                f"{t.file}: tensor '{gg}' is {t.qtype}; vLLM's CPU build has no GGUF kernels, "
                f"so every quantized tensor must be dequantized: {OPTION_HINT % '*'}"
            )
        if t.qtype not in KERNEL_TYPES:
            raise GGUFLoadError(
                f"{t.file}: tensor '{gg}' has type {t.qtype}, which vLLM's GGUF kernels cannot run; "
                f"dequantize it at load: {OPTION_HINT % gg}"
            )
    return Plan(tensors, names, dequant, tie_embeddings="output.weight" not in tensors)


def _close_packed_groups(tensors: dict[str, Tensor], names: NameMap, dequant: set[str]) -> None:
    """vLLM fuses q_a + kv_a, gate + up (dense and shared expert) and the three expert
    tensors of a layer into one module each: one precision per module."""
    for i in names.kv_b:
        for group in PACKED:
            members = [f"blk.{i}.{leaf}.weight" for leaf in group if f"blk.{i}.{leaf}.weight" in tensors]
            if any(m in dequant for m in members):
                dequant.update(m for m in members if tensors[m].qtype not in UNQUANTIZED)


def iter_weights(plan: Plan, dtype, counts: Counter) -> Iterator[tuple[str, object]]:
    """(hf name, tensor) in vLLM's GGUF convention: all qweight_type entries first,
    then data; dequantized tensors as plain `.weight`. One tensor in memory at a time."""
    import torch

    kept = {g: t for g, t in plan.tensors.items() if g not in plan.dequant and t.qtype not in UNQUANTIZED}
    for gg, t in kept.items():
        hf = _hf_for_kept(plan.names, gg)
        yield hf.replace("weight", "qweight_type"), torch.tensor(t.reader_tensor.tensor_type)
    for gg, t in plan.tensors.items():
        names = plan.names
        if IGNORED.match(gg) or _is_kv_b_part(gg):
            continue
        if gg in kept:
            hf = _hf_for_kept(names, gg).replace("weight", "qweight")
            counts[hf] += 1
            yield hf, torch.tensor(t.reader_tensor.data)
            continue
        if gg in names.experts:  # one expert at a time: never the whole stack dense
            template, n = names.experts[gg]
            if t.shape[0] != n:
                raise GGUFLoadError(f"{t.file}: tensor '{gg}' has {t.shape[0]} experts, config says {n}")
            for e in range(n):
                counts[template.format(e=e)] += 1
                yield template.format(e=e), dequantize(t, dtype, index=e)
        else:
            counts[names.direct[gg]] += 1
            yield names.direct[gg], dequantize(t, dtype)
    for i, hf in plan.names.kv_b.items():
        kv, kb, vb = _kv_b_parts(i)
        if kv in plan.tensors:
            merged = dequantize(plan.tensors[kv], dtype)
        else:
            merged = merge_kv_b(dequantize(plan.tensors[kb], dtype), dequantize(plan.tensors[vb], dtype))
        counts[hf] += 1
        yield hf, merged


def _hf_for_kept(names: NameMap, gg: str) -> str:
    if gg in names.direct:
        return names.direct[gg]
    template, _ = names.experts[gg]
    return template.format(e=0)  # vLLM's GGUF MoE loader takes the merged 3-D tensor here


def audit_loaded(model, loaded: set[str] | None, counts: Counter, source: str) -> None:
    twice = sorted(n for n, c in counts.items() if c > 1)
    if twice:
        raise GGUFLoadError(f"{source}: weights written more than once (audit): {twice}")
    if loaded is None:
        return
    params = {n for n, _ in model.named_parameters()}
    missing = sorted(params - set(loaded))
    if missing:
        raise GGUFLoadError(f"{source}: model parameters not written by the GGUF (audit): {missing}")


def is_deepseek2(hf_config) -> bool:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return (
        getattr(text, "model_type", None) in DEEPSEEK2_TYPES
        or getattr(hf_config, "model_type", None) in DEEPSEEK2_TYPES
    )


def load_deepseek2(loader, vllm_config, model_config, prefix: str = ""):
    """GGUFModelLoader.load_model for deepseek2-architecture GGUFs (vLLM <= 0.23)."""
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype

    first = loader._prepare_weights(model_config)
    shards = discover_shards(first)
    cfg = model_config.hf_config
    text = cfg.get_text_config()
    names = deepseek2_name_map(text, prefix="language_model." if text is not cfg else "")
    plan = make_plan(shards, names, loader.options, on_cpu=current_platform.is_cpu())
    if plan.tie_embeddings:
        cfg.update({"tie_word_embeddings": True})
    vllm_config.quant_config.unquantized_modules.extend(plan.unquantized_modules())
    target_device = torch.device(vllm_config.device_config.device)
    counts: Counter = Counter()
    with set_default_torch_dtype(model_config.dtype):
        with target_device:
            model = initialize_model(vllm_config=vllm_config, prefix=prefix)
        loaded = model.load_weights(iter_weights(plan, model_config.dtype, counts))
        audit_loaded(model, loaded, counts, first)
        process_weights_after_loading(model, model_config, target_device)
    return model
