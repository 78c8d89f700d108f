"""The runtime wheel, as CI builds it (ci/test.sh's wheel tier, ~30 s):

1. builds the runtime wheel (setup.py) and the tools wheel (tools/setup.py) from a clean copy
   of the checkout (a stale build/ folder would otherwise leak old files into the wheel);
2. prints the runtime wheel's size and file count, and fails if it carries a tools module
   (training, benchmarks, the tiny demo models and their weights: vllm_k2_tools) or if one of
   its modules imports one;
3. prints the import time of the entry point vLLM loads in each of its processes, from the
   unpacked wheel in a fresh interpreter: ``import vllm_k2_plugin; vllm_k2_plugin.register``,
   then, in a process that has imported vLLM as every vLLM process has, what ``register()``
   adds (our modules' import, then applying the patches). Timings are printed, never asserted.

    python ci/wheel_check.py [--python VENV/bin/python]   # the engine venv to time in

The building Python (this one) needs setuptools and pip; the timing Python needs vLLM.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNTIME = "vllm_k2_plugin"
TOOLS = "vllm_k2_tools"
#: The one runtime module allowed to name the tools: the CLI looks them up by name to add
#: `train`, `bench` and `fixture` when they are installed (and says what to install otherwise).
OPTIONAL_HOOKS = {(f"{RUNTIME}/cli.py", f"{TOOLS}.cli")}
#: Where the tools lived inside the runtime package before the split: none may come back.
OLD_TOOL_PATHS = (
    "train/",
    "bench/",
    "fixtures/",
    "mla/bench.py",
    "mla/stock.py",
    "mla/roofline.py",
    "procs.py",
    "speculators_compat/dataset.py",
)


def clean_copy(dest: Path) -> Path:
    """The checkout's files as a fresh clone of this working tree would have them (tracked and
    new, not ignored): no build/, egg-info or caches."""
    try:
        listed = (
            subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked archive)
        skip = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
        shutil.copytree(REPO, dest, ignore=skip, symlinks=True)
        return dest
    for name in filter(None, listed):
        src = REPO / name
        if not src.exists() and not src.is_symlink():  # deleted in the working tree, not yet in git
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dest / name)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def build_wheel(project: Path, out: Path) -> Path:
    before = set(out.glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps"]
    pip.append("--no-build-isolation")  # the setuptools at hand: CI machines may not reach PyPI
    r = subprocess.run([*pip, "-w", str(out), str(project)], capture_output=True, text=True)
    if r.returncode != 0:  # pip's output only then: it is otherwise config noise of the machine
        sys.exit(f"building {project} failed:\n{r.stdout}{r.stderr}")
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def imported_names(path: str, source: str) -> list[tuple[int, str]]:
    """Every module a Python file imports, absolute (relative imports resolved against its
    package), with import_module("...") and __import__("...") calls on a literal name."""
    package = path.removesuffix(".py").replace("/", ".")
    if not path.endswith("/__init__.py"):
        package = package.rpartition(".")[0]
    else:
        package = package.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def tool_problems(names: list[str], read) -> list[str]:
    """What makes a runtime wheel wrong: a tools file in it, a weights file, a module of the
    runtime that imports the tools (``read(name)`` gives a file's text)."""
    problems = []
    for name in names:
        if name.startswith(f"{TOOLS}/") or name.endswith(".safetensors"):
            problems.append(f"{name}: a tools file in the runtime wheel")
        elif name.startswith(f"{RUNTIME}/") and name.removeprefix(f"{RUNTIME}/").startswith(OLD_TOOL_PATHS):
            problems.append(f"{name}: a tools module inside the runtime package")
        if name.endswith(".py") and not name.startswith(TOOLS):
            for line, module in imported_names(name, read(name)):
                if (module == TOOLS or module.startswith(f"{TOOLS}.")) and (name, module) not in OPTIONAL_HOOKS:
                    problems.append(f"{name}:{line}: imports {module}")
    return problems


#: Run in a fresh interpreter of the timing venv, the unpacked runtime wheel first on sys.path.
ENTRY_POINT = """
import sys, time
t = time.perf_counter()
import vllm_k2_plugin
vllm_k2_plugin.register
print(time.perf_counter() - t, vllm_k2_plugin.__file__)
"""
IN_VLLM = """
import json, sys, time
import vllm  # every process vLLM loads the plugin into has imported it
t0 = time.perf_counter()
import vllm_k2_plugin
from vllm_k2_plugin.features import load_feature_patches
from vllm_k2_plugin.settings import Settings
load_feature_patches(Settings.from_env().extra_patch_modules)
t1 = time.perf_counter()
vllm_k2_plugin.register()
t2 = time.perf_counter()
from vllm_k2_plugin.patching import REGISTRY
print(json.dumps({"modules_s": t1 - t0, "apply_s": t2 - t1, "file": vllm_k2_plugin.__file__,
                  "vllm": vllm.__version__, "patches": len(list(REGISTRY)),
                  "plugin_modules": sorted(m for m in sys.modules if m.startswith("vllm_k2_plugin")),
                  "tools_modules": sorted(m for m in sys.modules if m.split(".")[0] == "vllm_k2_tools")}))
"""


def time_register(python: str, site: Path, work: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_K2_")}  # the defaults, as a user has
    env["PYTHONPATH"] = str(site)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    compileall.compile_dir(str(site), quiet=1)  # as pip does at install: no first-import compile in the timing
    problems = []
    runs = []
    for _ in range(5):
        out = subprocess.run(
            [python, "-c", ENTRY_POINT], env=env, cwd=work, check=True, capture_output=True, text=True
        ).stdout.split()
        runs.append(float(out[0]))
        if not out[1].startswith(str(site)):
            problems.append(f"timed {out[1]}, not the wheel's copy under {site}")
    ms = ", ".join(f"{r * 1e3:.1f}" for r in runs)
    print(
        f"  entry point (import vllm_k2_plugin; vllm_k2_plugin.register), fresh interpreter: "
        f"median {statistics.median(runs) * 1e3:.1f} ms (runs: {ms} ms)"
    )
    r = subprocess.run([python, "-c", IN_VLLM], env=env, cwd=work, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return problems + [f"register() in a vLLM process failed:\n{r.stderr[-3000:]}"]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"  register() in a process that imported vLLM {got['vllm']}: {got['modules_s'] * 1e3:.0f} ms importing "
        f"{len(got['plugin_modules'])} plugin modules, then {got['apply_s']:.2f} s applying {got['patches']} "
        "patches (importing the vLLM modules they change)"
    )
    if not got["file"].startswith(str(site)):
        problems.append(f"register() ran {got['file']}, not the wheel's copy under {site}")
    if got["tools_modules"]:
        problems.append(f"register() imported tools modules: {got['tools_modules']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="interpreter of the engine venv to time register() in")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-k2-wheel-") as tmp:
        tmp = Path(tmp)
        src = clean_copy(tmp / "src")
        dist = tmp / "dist"
        runtime = build_wheel(src, dist)
        tools = build_wheel(src / "tools", dist)
        with zipfile.ZipFile(runtime) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            packages = sorted({n.split("/")[0] for n in names if ".dist-info/" not in n})
            problems = tool_problems(names, lambda n: z.read(n).decode())
            z.extractall(tmp / "site")
        with zipfile.ZipFile(tools) as z:
            tool_names = [n for n in z.namelist() if not n.endswith("/")]
        problems += [
            f"{tools.name}: {n} belongs to the runtime wheel" for n in tool_names if n.startswith(f"{RUNTIME}/")
        ]
        modules = sum(n.endswith(".py") for n in names)
        print(
            f"runtime wheel {runtime.name}: {runtime.stat().st_size / 1024:.0f} KiB, {len(names)} files "
            f"({modules} Python modules), top-level: {', '.join(packages)}"
        )
        print(f"tools wheel   {tools.name}: {tools.stat().st_size / 1024**2:.1f} MiB, {len(tool_names)} files")
        print(f"timing in {args.python}")
        problems += time_register(args.python, tmp / "site", tmp)
    for line in problems:
        print(f"FAIL {line}", file=sys.stderr)
    print("runtime wheel: " + ("FAILED" if problems else "no tools module in it, none imported by register()"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
