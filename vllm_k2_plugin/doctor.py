"""`vllm-k2 doctor`: what is installed, and what the plugin does to it."""

from __future__ import annotations

import importlib.metadata as md
import os

from .patching import REGISTRY
from .patching.registry import applied_patch_files
from .patching.runner import model_runner_for_kimi
from .patching.versions import (
    SUPPORTED,
    SUPPORTED_RANGE,
    SUPPORTED_TEXT,
    package_version,
    vllm_release,
    vllm_version_string,
)
from .settings import DOCUMENTED, Settings

ENTRY_GROUP = "vllm.general_plugins"


def gpu_description() -> str:
    """The GPU as vLLM's platform sees it (no CUDA context is made to find out)."""
    from .platform import on_cuda

    try:
        if not on_cuda():
            return "none (vLLM's platform is not CUDA)"
        import torch

        cc = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]}, {torch.cuda.device_count()} visible)"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__}: {e})"


def our_entry_points() -> list[str]:
    return [
        f"{ep.name} = {ep.value}" for ep in md.entry_points(group=ENTRY_GROUP) if ep.value.startswith("vllm_k2_plugin")
    ]


def load_through_vllm() -> tuple[bool, str]:
    """Let vLLM's own plugin loader run us, as it does in every vLLM process."""
    import vllm_k2_plugin

    if vllm_version_string() is None:
        return False, "vLLM is not installed"
    before = vllm_k2_plugin._LOADS
    try:
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    except Exception as e:  # noqa: BLE001
        return False, f"vLLM's plugin loader failed: {type(e).__name__}: {e}"
    if vllm_k2_plugin._LOADS > before:
        return True, "register() was called by vllm.plugins.load_general_plugins()"
    if Settings.from_env().disabled:
        return False, "VLLM_K2_DISABLE is set"
    allow = os.environ.get("VLLM_PLUGINS")
    if allow is not None:
        return False, f"VLLM_PLUGINS={allow!r} does not allow 'vllm_k2_plugin'"
    return False, "vLLM did not call register() (entry point missing? reinstall the package)"


#: What serving needs, and what each is for (doctor names the missing ones).
NEEDED = {"vllm": "the engine the plugin patches", "torch": "vLLM's tensors, the MLA kernel, training"}


def features(patches: list[dict]) -> dict[str, dict]:
    """Per feature: whether it acts here (one of its patches applied) and, if not, why (the first
    patch's reason). A feature vLLM already has (all retired upstream) is said so."""
    out: dict[str, dict] = {}
    for p in patches:
        out.setdefault(p["feature"], []).append(p)
    summary = {}
    for feature, rows in out.items():
        applied = [r["name"] for r in rows if r["state"] == "applied"]
        if applied:
            summary[feature] = {"acts": True, "detail": ", ".join(applied)}
        elif all(r["state"] == "retired-upstream" for r in rows):
            summary[feature] = {"acts": False, "detail": "vLLM does this itself"}
        else:
            first = next(r for r in rows if r["state"] != "retired-upstream")
            summary[feature] = {"acts": False, "detail": f"{first['name']} {first['state']}: {first['reason']}"}
    return summary


def collect() -> dict:
    loaded, how = load_through_vllm()
    release = vllm_release()
    if not loaded:  # still list every patch (importing the feature modules applies nothing)
        from .features import load_feature_patches

        load_feature_patches(Settings.from_env().extra_patch_modules)
        if vllm_version_string() is None:
            REGISTRY.apply_all()  # touches nothing: each is marked "vLLM is not installed"
    return {
        "versions": {
            "vllm-k2-plugin": package_version("vllm-k2-plugin"),
            "vllm": vllm_version_string(),
            "torch": package_version("torch"),
            "triton": package_version("triton"),
            "transformers": package_version("transformers"),
            "speculators": package_version("speculators"),
            "gguf": package_version("gguf"),
        },
        "vllm_supported": bool(release and SUPPORTED.contains(release)),
        "supported_range": f"{SUPPORTED_TEXT} (vllm{SUPPORTED_RANGE})",
        "model_runner": _runner(),
        "gpu": gpu_description(),
        "entry_points": our_entry_points(),
        "loaded_by_vllm": loaded,
        "loaded_how": how,
        "settings": {name: os.environ.get(name, "") for name, _ in DOCUMENTED},
        "patches": [p.describe() for p in REGISTRY],
        "features": features([p.describe() for p in REGISTRY]),
        "patch_files_applied": applied_patch_files(),
    }


def _runner() -> dict | None:
    """Which model runner a Kimi-K2.x engine with EAGLE-3 gets on this vLLM (None: no vLLM)."""
    try:
        choice = model_runner_for_kimi()
    except Exception as e:  # noqa: BLE001 - doctor reports, never crashes
        return {"runner": "?", "name": "unknown", "how": f"{type(e).__name__}: {e}"}
    return None if choice is None else {"runner": choice.runner, "name": choice.name, "how": choice.how}


def render(report: dict) -> str:
    lines = ["vllm-k2 doctor", ""]
    for k, v in report["versions"].items():
        lines.append(f"  {k:16} {v or '-'}")
    missing = [f"{name} ({why})" for name, why in NEEDED.items() if not report["versions"].get(name)]
    if missing:
        lines.append(f"  {'MISSING':16} " + "; ".join(missing))
    sup = "yes" if report["vllm_supported"] else "NO"
    runner = report["model_runner"]
    runner_line = f"{runner['name']} ({runner['how']})" if runner else "- (vLLM is not installed)"
    lines += [
        f"  {'vllm supported':16} {sup}: {report['supported_range']}",
        f"  {'model runner':16} {runner_line}",
        f"  {'gpu':16} {report['gpu']}",
        f"  {'entry point':16} {', '.join(report['entry_points']) or 'MISSING'}",
        f"  {'loaded by vLLM':16} {'yes' if report['loaded_by_vllm'] else 'NO'}: {report['loaded_how']}",
        "",
        "settings:",
    ]
    for name, meaning in DOCUMENTED:
        setting = f"{name}={report['settings'][name]}"
        lines.append(f"  {setting:34} # {meaning}")
    applied = report["patch_files_applied"]
    in_force = f"applied to this vLLM: {', '.join(applied)}" if applied else "none applied (runtime only)"
    lines += [
        "",
        f"patch files (patches/vllm-<version>/): {in_force}",
        "",
        f"features (for {runner['name'] if runner else 'no vLLM'}):",
    ]
    width = max((len(f) for f in report["features"]), default=0)
    for feature, f in report["features"].items():
        lines.append(f"  {feature:<{width}}  {'acts' if f['acts'] else 'off'}: {f['detail']}")
    lines += ["", "patches:"]
    lines.append(render_patch_table(report["patches"]))
    return "\n".join(lines)


def render_patch_table(rows: list[dict], verbose: bool = False) -> str:
    if not rows:
        return "  (no patches registered)"
    width = max(len(r["name"]) for r in rows)
    out = []
    for r in rows:
        state = r["state"] + (f": {r['reason']}" if r["reason"] and r["state"] != "applied" else "")
        out.append(f"  {r['name']:<{width}}  {state}")
        if verbose:
            out.append(f"  {'':<{width}}  target      {r['target']}")
            out.append(f"  {'':<{width}}  applies to  vllm{r['applies_to']}")
            out.append(f"  {'':<{width}}  upstream    {r['upstream']}")
            out.append(f"  {'':<{width}}  why         {r['why']}")
            out.append(f"  {'':<{width}}  remove when {r['remove_when']}")
            if r["patch_file"]:
                out.append(f"  {'':<{width}}  patch file  {r['patch_file']}")
    return "\n".join(out)
