"""Route B's edits to an unpacked vLLM 0.16.0 sdist (build_route_b.sh runs this; nothing is committed of vLLM).

Route B compiles 0.16's own C++/CUDA kernels against the device's torch 2.11 / CUDA 13, for sm_90a only
and only the kernels a bf16 MLA/MoE engine reaches (plus every op a compile pass names in its patterns):
the whole of ``_C`` and ``_moe_C`` is hours of nvcc on two cores (Marlin, Machete, CUTLASS GEMMs).

  cmake  SRC              : the extension targets take the source lists given at configure time
                            (-DVLLM_K2_EXT_SRC / -DVLLM_K2_MOE_EXT_SRC), without the CUTLASS GEMM
                            switches (-DENABLE_SCALED_MM_* etc.; -DENABLE_FP8 stays), and the four
                            external projects are left out
                            (FlashAttention comes from 0.20's build, as in route C; FlashMLA and
                            qutlass are not on this path; triton_kernels ships as Python in the wheel)
  bindings SRC OBJ...     : each ``torch_bindings.cpp`` keeps the registrations whose functions the
                            compiled objects define (or csrc's headers define); a schema
                            whose implementation was dropped goes with it. Prints what was dropped.

Every edit must match exactly where expected, or this exits naming the anchor (0.16.0's sdist is pinned
by hash in build_route_b.sh).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXTERNAL = (
    "include(cmake/external_projects/triton_kernels.cmake)",
    "include(cmake/external_projects/flashmla.cmake)",
    "include(cmake/external_projects/qutlass.cmake)",
    "include(cmake/external_projects/vllm_flash_attn.cmake)",
)
C_TARGET = 'message(STATUS "Enabling C extension.")'
MOE_TARGET = 'message(STATUS "Enabling moe extension.")'


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        sys.exit(f"route_b_tree: {where}: expected one {old!r}, found {text.count(old)}")
    return text.replace(old, new)


def edit_cmake(src: Path) -> None:
    path = src / "CMakeLists.txt"
    text = path.read_text()
    for line in EXTERNAL:
        text = _replace_once(text, line, f"# route B: left out: {line}", str(path))
    text = _replace_once(
        text,
        C_TARGET,
        "set(VLLM_EXT_SRC ${VLLM_K2_EXT_SRC})  # route B: the subset\n"
        'list(FILTER VLLM_GPU_FLAGS EXCLUDE REGEX "^-DENABLE_(SCALED_MM|SPARSE|NVFP4|CUTLASS)")  # none compiled\n'
        + C_TARGET,
        str(path),
    )
    text = _replace_once(
        text,
        MOE_TARGET,
        "set(VLLM_MOE_EXT_SRC ${VLLM_K2_MOE_EXT_SRC})  # route B: the subset\n" + MOE_TARGET,
        str(path),
    )
    path.write_text(text)


def _defined_functions(objects: list[str]) -> set[str]:
    """Qualified names of the functions the objects define (C++ demangled, arguments cut)."""
    out = subprocess.run(["nm", "-C", "--defined-only", *objects], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "TtWw":
            names.add(parts[2].split("(", 1)[0].split("<", 1)[0])
    return names


def _defined_in_headers(src: Path) -> set[str]:
    """Functions csrc's headers define with a body (``ops.h`` has some, not all ``inline``):
    torch_bindings.cpp compiles those itself."""
    names = set()
    head = re.compile(r"^[A-Za-z_][\w:<>,]*(?:[\s*&]+[\w:<>,]+)*?[\s*&]+(\w+)\s*\([^;{}]*\)\s*(?:const\s*)?\{", re.M)
    for h in (src / "csrc").rglob("*.h"):
        names.update(m.group(1) for m in head.finditer(h.read_text()))
    return names


_STATEMENT = re.compile(r"\b\w+\.(def|impl)\s*\(")
_OP_NAME = re.compile(r'\.(?:def|impl)\s*\(\s*"(\w+)')
_FN_REF = re.compile(r"&\s*([\w:]+)")


def _statements(body: list[str]):
    """Split a library block's lines into (lines, is_registration) units; a registration ends at ';'."""
    unit: list[str] = []
    depth = 0
    for line in body:
        code = line.split("//", 1)[0]
        if not unit and not _STATEMENT.search(code):
            yield [line], False
            continue
        unit.append(line)
        depth += code.count("(") - code.count(")")
        if depth == 0 and code.rstrip().endswith(";"):
            yield unit, True
            unit = []
    if unit:
        sys.exit(f"route_b_tree: an unterminated registration: {''.join(unit)!r}")


def filter_bindings(path: Path, available: set[str]) -> list[str]:
    lines = path.read_text().splitlines(keepends=True)
    units = list(_statements(lines))
    dropped_ops: set[str] = set()
    for unit, is_reg in units:
        text = "".join(unit)
        if is_reg and any(
            ref.split("::")[-1] not in available and ref not in available for ref in _FN_REF.findall(text)
        ):
            m = _OP_NAME.search(text)
            if not m:
                sys.exit(f"route_b_tree: {path}: a registration without an op name: {text!r}")
            dropped_ops.add(m.group(1))
    kept = []
    for unit, is_reg in units:
        m = _OP_NAME.search("".join(unit)) if is_reg else None
        if m and m.group(1) in dropped_ops:
            kept.append("// route B: not compiled: " + " ".join(x.strip() for x in unit) + "\n")
        else:
            kept.extend(unit)
    path.write_text("".join(kept))
    return sorted(dropped_ops)


def main(argv: list[str]) -> None:
    if argv[:1] == ["cmake"] and len(argv) == 2:
        edit_cmake(Path(argv[1]))
    elif argv[:1] == ["bindings"] and len(argv) > 3:
        src = Path(argv[1])
        available = _defined_functions(argv[2:]) | _defined_in_headers(src)
        available |= {n.split("::")[-1] for n in available}
        for rel in ("csrc/torch_bindings.cpp", "csrc/moe/torch_bindings.cpp"):
            dropped = filter_bindings(src / rel, available)
            print(f"route_b_tree: {rel}: {len(dropped)} ops not compiled: {' '.join(dropped)}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
