#!/usr/bin/env bash
# Check the vLLM 0.26.0 bundle (.gpub026, from build.sh) on this machine, without a GPU:
#   bash benchmarks/vllm026_gpu/check.sh
# 1. unpacks it as install.sh does on the device (into a temp dir) and prints each part's size;
# 2. byte-compiles vLLM's kept Python tree (python3.12 where there is one: the device's Python; else python3);
# 3. kernels: each pruned library against the wheel's own: fatbin in place, every kept translation unit's sm_90
#    entries byte-identical, every replaced entry a valid placeholder, dynamic symbols unchanged, same NEEDED libs;
#    and 0.20's chk.py (every zstd-compressed entry decompresses);
# 4. imports the engine's modules and every other kept module, and registers the repo's vLLM plugin (impcheck.py),
#    with this machine's python3 and a CPU torch: needs a local venv with torch for python3's version
#    (CHECK_IMG_SITE=its site-packages; by default the first ~/.cache/vllm-k2-plugin/venv-*/lib/python3.X/
#    site-packages holding torch; only read). Only the device image's packages (image_packages.txt) are linked from
#    it, never its vllm. The bundle's compiled dependencies are cp312: their twins for python3's version (same
#    versions) are downloaded into $CACHE/deps026-cpXY, and the image's own huggingface-hub / transformers /
#    tokenizers / safetensors into $CACHE/image026, for this check only. CHECK_KEEP=1 keeps the temp dir.
# What this cannot check (no GPU here): that the kernels load and run (a kernel of a dropped unit fails loudly,
# "invalid device function"), op registration by the real .so files, and anything the engine imports only while it
# runs (model loading, CUDA graphs); the tracer of the 0.20 bundle does that on the device (README.md).
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1   # no __pycache__ left in the repo by the helper scripts
H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd); B=$R/.gpub026
[[ -f $B/BUILD ]] || { echo "no $B: run bash benchmarks/vllm026_gpu/build.sh first" >&2; exit 2; }
CACHE=${GPUB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpub}
WHL=$(ls "$CACHE"/vllm-0.26.0-*.whl | head -1)
NICE="nice -n 10"
T=$(mktemp -d); [[ -n ${CHECK_KEEP:-} ]] && echo "check dir: $T (kept)" || trap 'rm -rf "$T"' EXIT
S0=$SECONDS; rc=0

echo "== 1. unpack ($(du -cb "$B" | tail -1 | cut -f1) bytes in .gpub026)"
du -b "$B"/so/* "$B"/*.tar.xz | sed "s|$R/||"
mkdir -p "$T/site" "$T/orig"
$NICE python3 "$H/unpack.py" "$T/site" "$B"
echo "unpacked: $(du -sh "$T/site" | cut -f1), $(find "$T/site/vllm" -name '*.py' | wc -l) vLLM .py files"

echo "== 2. byte-compile"
PY312=""
for c in python3.12 ~/.pyenv/versions/3.12*/bin/python3.12; do
  if "$c" -c '' 2>/dev/null; then PY312=$c; break; fi
done
for py in ${PY312:-} python3; do
  [[ -n $py ]] || continue
  if $NICE "$py" -m compileall -q -j 2 "$T/site/vllm" > "$T/cc.log" 2>&1; then
    echo "compileall OK with $($py --version 2>&1)"
  else
    echo "compileall FAILED with $($py --version 2>&1)"; tail -20 "$T/cc.log"; rc=1
  fi
done
find "$T/site" -name __pycache__ -prune -exec rm -rf {} +

echo "== 3. kernels"
for f in _C_stable_libtorch _moe_C_stable_libtorch _vllm_fa3_C cumem_allocator; do
  src=vllm/$f.abi3.so; [[ $f == _vllm_fa3_C ]] && src=vllm/vllm_flash_attn/$f.abi3.so
  unzip -q -o -j "$WHL" "$src" -d "$T/orig"
  got=$T/site/$src
  [[ $f != cumem_allocator ]] && { $NICE python3 "$H/prune026.py" --check "$T/orig/$f.abi3.so" "$got" || rc=1; }
  $NICE python3 "$H/prune026.py" --dynsym "$T/orig/$f.abi3.so" "$got" || rc=1
  cmp -s <(readelf -d "$T/orig/$f.abi3.so" | grep NEEDED) <(readelf -d "$got" | grep NEEDED) \
    || { echo "$f: NEEDED libraries differ"; rc=1; }
  rm -f "$T/orig/$f.abi3.so"
done
# 0.20's chk.py: every zstd-compressed fatbin entry decompresses to its recorded size
$NICE python3 "$R/benchmarks/vllm020_gpu/chk.py" "$T/site/vllm/_C_stable_libtorch.abi3.so" \
  "$T/site/vllm/_moe_C_stable_libtorch.abi3.so" | grep "compressed entries" | sed "s|$T/site/||" | tee "$T/chk.log"
grep -q "bad [1-9]" "$T/chk.log" && rc=1

echo "== 4. imports (CPU, no GPU)"
PYV=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'); CP=cp${PYV/./}
IMGSRC=${CHECK_IMG_SITE:-$(ls -d ~/.cache/vllm-k2-plugin/venv-*/lib/python$PYV/site-packages 2>/dev/null \
  | while read -r d; do [[ -d $d/torch ]] && echo "$d" && break; done || true)}
if [[ -z $IMGSRC || ! -d $IMGSRC/torch ]]; then
  echo "no local site-packages with torch for python $PYV (set CHECK_IMG_SITE): import check SKIPPED"; rc=1
else
  echo "image stand-in: $IMGSRC (torch $(cat "$IMGSRC"/torch-*.dist-info/METADATA | grep -m1 '^Version' | cut -c10-))"
  # IMG: links to the image's distributions only (by their RECORD's top-level names)
  mkdir -p "$T/img" "$T/twins"
  python3 - "$IMGSRC" "$T/img" "$H/image_packages.txt" <<'PY'
import os, re, sys, glob
src, dst, lst = sys.argv[1:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
want = {norm(l.strip()) for l in open(lst) if l.strip() and not l.startswith("#")}
tops, found = set(), set()
for di in glob.glob(f"{src}/*.dist-info"):
    name = norm(os.path.basename(di)[:-10].rsplit("-", 1)[0])
    if name not in want or name == "vllm":
        continue
    found.add(name)
    os.symlink(di, os.path.join(dst, os.path.basename(di)))
    rec = os.path.join(di, "RECORD")
    for line in open(rec) if os.path.exists(rec) else []:
        top = line.split(",")[0].split("/")[0]
        if top and not top.endswith((".dist-info", ".data")) and top not in ("..", "__pycache__") and top != "vllm":
            tops.add(top)
for t in sorted(tops):
    if os.path.exists(os.path.join(src, t)) and not os.path.exists(os.path.join(dst, t)):
        os.symlink(os.path.join(src, t), os.path.join(dst, t))
with open(os.path.join(dst, ".image_tops"), "w") as f:
    f.write("\n".join(sorted({t[:-3] if t.endswith(".py") else t.split(".")[0] for t in tops})) + "\n")
print(f"image stand-in: {len(found)} of {len(want)} image distributions found locally; missing: "
      f"{' '.join(sorted(want - found))}")
PY
  # the image's own versions of the packages whose version changes what vLLM imports (KINDS.md's pip list)
  mkdir -p "$CACHE/image026" "$T/imgpin"
  IMGPIN="huggingface-hub==1.33.0 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0"
  # shellcheck disable=SC2086
  $NICE python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/image026" $IMGPIN 2>&1 \
    | grep -v "is ignored: it is neither" || true
  # shellcheck disable=SC2086
  $NICE python3 "$R/benchmarks/vllm016_gpu/unpack_wheels.py" "$CACHE/image026" "$T/imgpin" $IMGPIN
  for e in "$T"/imgpin/*; do n=$(basename "$e"); rm -rf "${T:?}/img/$n" "$T"/img/"${n%%-[0-9]*}"-*.dist-info; mv "$e" "$T/img/"; done
  # TWINS: the bundle's compiled dependencies, same versions, for this Python
  DEPS=$(grep -v '^#' "$H/deps.txt")
  mkdir -p "$CACHE/deps026-$CP"
  # shellcheck disable=SC2086
  $NICE python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" -d "$CACHE/deps026-$CP" \
    $(for d in $DEPS; do n=${d%%==*}; ls "$CACHE"/deps026/ | grep -qi "^${n//-/_}-.*-none-any.whl" || echo "$d"; done) \
    2>&1 | grep -v "is ignored: it is neither" || true
  $NICE python3 "$R/benchmarks/vllm016_gpu/unpack_wheels.py" "$CACHE/deps026-$CP" "$T/twins" \
    $(for d in $DEPS; do n=${d%%==*}; ls "$CACHE"/deps026/ | grep -qi "^${n//-/_}-.*-none-any.whl" || echo "$d"; done)
  find "$T/twins" -maxdepth 1 -name '*.dist-info' -exec rm -rf {} +   # metadata comes from the bundle's copies
  # install.sh's rule: the bundled typing_extensions only if the image's is older than pydantic 2.12 needs
  if PYTHONPATH="$T/img" python3 -S -c "import importlib.metadata as m,sys; from packaging.version import Version as V; \
sys.exit(0 if V(m.version('typing_extensions'))>=V('4.14.1') else 1)"; then
    rm -rf "$T"/site/typing_extensions.py "$T"/site/typing_extensions-*.dist-info
  fi
  unzip -Z1 "$WHL" > "$T/wheel_files.txt"
  if (cd "$T" && PYTHONPATH="$T/twins:$T/site:$T/img" $NICE timeout 900 python3 -S "$H/impcheck.py" \
       "$T/site" "$T/twins" "$T/img" "$T/wheel_files.txt" "$R" > "$T/imp.log" 2>&1); then
    grep "^impcheck\|^  " "$T/imp.log"
  else
    grep "^impcheck\|^  \|Error\|Traceback" "$T/imp.log" | tail -60; rc=1
  fi
fi
echo "check026: $([[ $rc == 0 ]] && echo OK || echo FAILED) in $((SECONDS - S0)) s"
exit $rc
