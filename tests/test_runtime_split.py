"""The runtime plugin (vllm_k2_plugin, what vLLM loads in every process) and the tools
(vllm_k2_tools: training, benchmarks, the demo's tiny models) are two distributions: no
runtime module imports a tools module, register() loads none, and without the tools their
commands say which package to install. ci/wheel_check.py checks the same on the built wheel."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO, engine_env

sys.path.insert(0, str(REPO / "ci"))
import wheel_check  # noqa: E402

RUNTIME = REPO / "vllm_k2_plugin"


def _runtime_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in RUNTIME.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@pytest.mark.vllm_independent
def test_no_runtime_module_imports_a_tools_module():
    files = _runtime_files()
    assert "vllm_k2_plugin/features.py" in files and len([f for f in files if f.endswith(".py")]) > 50
    assert wheel_check.tool_problems(files, lambda name: (REPO / name).read_text()) == []


@pytest.mark.vllm_independent
def test_the_import_check_sees_every_form_of_import():
    src = (
        "import vllm_k2_tools.train\n"
        "from vllm_k2_tools import fixtures\n"
        "def f():\n"
        "    from vllm_k2_tools.bench.ab import Mode\n"
        "    importlib.import_module('vllm_k2_tools.procs')\n"
    )
    found = [m for _, m in wheel_check.imported_names("vllm_k2_plugin/doctor.py", src)]
    assert {"vllm_k2_tools.train", "vllm_k2_tools", "vllm_k2_tools.bench.ab", "vllm_k2_tools.procs"} <= set(found)
    # relative imports resolve against the module's package
    rel = [m for _, m in wheel_check.imported_names("vllm_k2_plugin/mla/backend.py", "from ..gguf import loader")]
    assert "vllm_k2_plugin.gguf.loader" in rel
    problems = wheel_check.tool_problems(
        ["vllm_k2_plugin/doctor.py", "vllm_k2_plugin/train/plan.py", "vllm_k2_tools/cli.py", "x/w.safetensors"],
        lambda name: src,
    )
    assert len([p for p in problems if "doctor.py:" in p]) == 6  # a from-import: the module and the name
    assert any("vllm_k2_plugin/train/plan.py: a tools module" in p for p in problems)
    assert any("vllm_k2_tools/cli.py: a tools file" in p for p in problems)
    assert any("x/w.safetensors" in p for p in problems)
    # the CLI's optional look-up is the one allowed
    hook = "import importlib\nimportlib.import_module('vllm_k2_tools.cli')\n"
    assert wheel_check.tool_problems(["vllm_k2_plugin/cli.py"], lambda name: hook) == []


PROBE = """
import json, sys
import vllm_k2_plugin
vllm_k2_plugin.register()
# every runtime command's module besides register()'s
import vllm_k2_plugin.doctor, vllm_k2_plugin.patching.files, vllm_k2_plugin.models.eagle3_checks
import vllm_k2_plugin.gguf.check, vllm_k2_plugin.comm.doctor
print(json.dumps({"file": vllm_k2_plugin.__file__,
                  "tools": sorted(m for m in sys.modules if m.split(".")[0] == "vllm_k2_tools")}))
"""


def test_register_loads_no_tools_module(tmp_path):
    """In a fresh interpreter (the tools importable: this checkout is on the path)."""
    r = subprocess.run(
        [sys.executable, "-c", PROBE], env=engine_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["file"] == str(RUNTIME / "__init__.py")
    assert got["tools"] == []


@pytest.mark.vllm_independent
@pytest.mark.parametrize("argv", [["train", "plan"], ["bench", "--help"], ["fixture", "k25", "--out", "x"]])
def test_tool_commands_without_the_tools_name_the_package(monkeypatch, capsys, argv):
    from vllm_k2_plugin.cli import build_parser, main

    for name in ("vllm_k2_tools", "vllm_k2_tools.cli"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"vllm-k2 {argv[0]}: " in err and "pip install vllm-k2-plugin-tools" in err and "tools/" in err
    # the runtime's own commands are all there
    assert build_parser().parse_args(["doctor", "--json"]).json
    assert build_parser().parse_args(["patches", "check"]).patches_command == "check"


@pytest.mark.vllm_independent
def test_tool_commands_with_the_tools():
    from vllm_k2_plugin.cli import build_parser
    from vllm_k2_tools.cli import _bench_ab

    assert build_parser().parse_args(["bench", "ab", "--target", "/m", "--mode", "ngram"]).func is _bench_ab
    assert build_parser().parse_args(["train", "plan"]).train_command == "plan"
