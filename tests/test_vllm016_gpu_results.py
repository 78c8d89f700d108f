"""The committed vLLM 0.16 GPU results (benchmarks/results/vllm016_h200) are what
benchmarks/vllm016_report.py makes of the raw case files, every raw file says which vLLM
and which route ran it, the route-C builder's wheel unpacker refuses what it cannot
resolve instead of skipping it, and route B's source edits keep exactly the registrations
whose functions were compiled."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "vllm016_h200"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "vllm016_gpu"))

import route_b_tree  # noqa: E402
import unpack_wheels  # noqa: E402
import vllm016_report  # noqa: E402


def test_committed_readme_and_summary_are_the_reports_output(tmp_path):
    vllm016_report.main([str(RESULTS / "raw"), "--out", str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads((RESULTS / "summary.json").read_text())
    ours = (tmp_path / "README.md").read_text().split("from `raw/`", 1)[1]
    assert ours == (RESULTS / "README.md").read_text().split("from `raw/`", 1)[1]


def test_tiny_greedy_tokens_are_compared_within_one_call_only():
    """Route C's stock engine against route B's ours would mix kernels: the report must not."""
    calls = vllm016_report.load_calls(RESULTS / "raw")
    stock_c = calls["2026-12-03-call3"]["v16-tiny-stock-graphs"]
    ours_b = calls["2026-12-04-call7"]["v16-tiny-ours-graphs"]
    assert stock_c["engine_route"].startswith("route C") and ours_b["engine_route"].startswith("route B")
    text = "\n".join(
        vllm016_report.tiny_sections(
            {"c": {"v16-tiny-stock-graphs": stock_c}, "b": {"v16-tiny-ours-graphs": ours_b}}, {}
        )
    )
    assert "v16-tiny-stock-graphs vs v16-tiny-ours-graphs" not in text
    assert "call c (route C)" in text
    both = "\n".join(vllm016_report.tiny_sections({"b": calls["2026-12-04-call7"]}, {}))
    assert "v16-tiny-stock-graphs vs v16-tiny-ours-graphs | our MLA backend" in both and "call b (route B)" in both


def test_every_raw_result_names_its_engine_route_command_and_date():
    raw = sorted((RESULTS / "raw").rglob("*.json"))
    assert raw
    for p in raw:
        r = json.loads(p.read_text())
        assert r["vllm"] == "0.16.0" and r["engine_route"].startswith(("route B", "route C")), p.name
        assert r["command"].startswith("gpu_engine_e2e.py case") and r["date"].startswith("2026"), p.name
        assert p.stem == r["case"]["name"]


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)


def test_unpacker_lays_out_wheels_and_drops_only_what_nothing_loads(tmp_path):
    wheels, site = tmp_path / "w", tmp_path / "site"
    wheels.mkdir()
    files = {"pkg_a/__init__.py": b"x = 1\n", "pkg_a/lib/libbig.a": b"ar", "pkg_a-1.0.data/purelib/pkg_a/extra.py": b""}
    _wheel(wheels, "pkg_a", "1.0", {**files, "pkg_a-1.0.data/scripts/tool": b""})
    _wheel(wheels, "mistral_common", "2.0", {"mistral_common/data/tok.json": b"{}", "mistral_common/base.py": b""})
    unpack_wheels.main([str(wheels), str(site), "pkg-a==1.0", "mistral-common==2.0"])
    got = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert got == ["mistral_common/base.py", "pkg_a/__init__.py", "pkg_a/extra.py"]


def test_unpacker_refuses_a_missing_wheel_before_writing_anything(tmp_path):
    wheels, site = tmp_path / "w", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "pkg_a", "1.0", {"pkg_a/__init__.py": b""})
    with pytest.raises(SystemExit, match=r"pkg-b==2\.0: 0 wheels"):
        unpack_wheels.main([str(wheels), str(site), "pkg-a==1.0", "pkg-b==2.0"])
    assert not site.exists()


BINDINGS = """#include "ops.h"
TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // kept: compiled
  ops.def("rms_norm(Tensor! out, Tensor input) -> ()");
  ops.impl("rms_norm", torch::kCUDA, &rms_norm);

  // its function is in a file route B does not compile
  ops.def(
      "paged_attention_v1("
      "    Tensor! out, Tensor query) -> ()");
  ops.impl("paged_attention_v1", torch::kCUDA,
           &paged_attention_v1);
#ifndef USE_ROCM
  ops.def("machete_prepack_B(Tensor B) -> Tensor", &machete::prepack_B);
  ops.def("gptq_marlin_gemm(Tensor a) -> Tensor");  // implemented by TORCH_LIBRARY_IMPL elsewhere
#endif
}
"""


def test_route_b_bindings_keep_only_what_the_objects_define(tmp_path):
    path = tmp_path / "torch_bindings.cpp"
    path.write_text(BINDINGS)
    dropped = route_b_tree.filter_bindings(path, {"rms_norm"})
    assert dropped == ["machete_prepack_B", "paged_attention_v1"]
    code = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("//")]
    assert "\n".join(code) == "\n".join(
        [
            '#include "ops.h"',
            "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {",
            '  ops.def("rms_norm(Tensor! out, Tensor input) -> ()");',
            '  ops.impl("rms_norm", torch::kCUDA, &rms_norm);',
            "",
            "#ifndef USE_ROCM",
            '  ops.def("gptq_marlin_gemm(Tensor a) -> Tensor");  // implemented by TORCH_LIBRARY_IMPL elsewhere',
            "#endif",
            "}",
        ]
    )


def test_route_b_cmake_edit_names_a_missing_anchor(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text('message(STATUS "Enabling C extension.")\n')
    with pytest.raises(SystemExit, match=r"CMakeLists.txt: expected one .*triton_kernels.cmake.*found 0"):
        route_b_tree.edit_cmake(tmp_path)
    assert (tmp_path / "CMakeLists.txt").read_text() == 'message(STATUS "Enabling C extension.")\n'
