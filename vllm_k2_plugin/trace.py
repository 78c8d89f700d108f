"""A per-process record of what register() did, for tests and `vllm-k2 doctor`.

Written only when VLLM_K2_TRACE_DIR is set: one JSON file per process, naming the
vLLM call site that loaded the plugin (API server, engine core, worker, ...).
"""

from __future__ import annotations

import json
import os
import sys

from . import fileio


def loader_call_site() -> str:
    """The innermost vLLM frame on the stack: who called load_general_plugins()."""
    frame = sys._getframe(1)
    sep = os.sep
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{sep}vllm{sep}" in path and f"{sep}plugins{sep}" not in path:
            rel = path[path.rfind(f"{sep}vllm{sep}") + 1 :]
            return f"{rel}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "not called from vLLM"


def process_title() -> str:
    try:
        import setproctitle

        return setproctitle.getproctitle()
    except Exception:  # noqa: BLE001 - optional dependency
        return os.path.basename(sys.argv[0]) if sys.argv else ""


def write_trace(trace_dir: str, loads: int | None = None) -> None:
    """This process's record: written by register(), rewritten when the scope gate first
    answers for a patch (``scope``: which patches acted for which model)."""
    from . import _LOADS
    from .patching import REGISTRY, scope
    from .patching.versions import vllm_version_string

    loads = _LOADS if loads is None else loads
    os.makedirs(trace_dir, exist_ok=True)
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "loads": loads,
        "title": process_title(),
        "call_site": loader_call_site(),
        "vllm": vllm_version_string(),
        "patches": {p.name: {"state": p.state.value, "reason": p.reason} for p in REGISTRY},
        "scope": scope.decisions(),
    }
    fileio.write_json(os.path.join(trace_dir, f"{os.getpid()}-{loads}.json"), record)  # readers never see half


def read_traces(trace_dir: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(trace_dir)):
        if name.endswith(".json"):
            with open(os.path.join(trace_dir, name)) as f:
                out.append(json.load(f))
    return out
