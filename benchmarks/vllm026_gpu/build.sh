#!/usr/bin/env bash
# Build a bundle that brings a real vLLM 0.26.0 engine, with its own CUDA kernels, to the lent GPU machine
# (one H100 / H200, sm_90, Python 3.12, torch 2.11 + CUDA 13, Triton 3.6, transformers 5.x, no network, no vLLM).
# 0.26.0's CUDA wheel is built for torch 2.11 / CUDA 13 like the image, so nothing is recompiled or patched: the
# bundle is the wheel, cut down to what a bf16 DeepSeek-V3 (MLA + MoE) + EAGLE-3 engine on one GPU runs.
#
#   bash benchmarks/vllm026_gpu/build.sh          # here (CPU), from anywhere in the repo; writes .gpub026/ (git-ignored)
#   bash benchmarks/vllm026_gpu/check.sh          # optional: checks the bundle on this machine (no GPU), see README
#   then, on the device, with .gpub026 carried (plus .gpub/e2e for the e2e suites):
#   ENGINE=vllm026 bash benchmarks/gpu_engine_device.sh SUITE:N     # installs it through install.sh into /tmp/site026
#
# What it takes, and why (README.md has the sizes and the reasons for every cut):
# 1. Kernels: _C_stable_libtorch, _moe_C_stable_libtorch, FA3 (_vllm_fa3_C, MLA prefill on sm_90) and cumem_allocator,
#    each with every fatbin entry that an sm_90 device cannot load, or that belongs to a translation unit not on
#    prune026.py's keep-lists, replaced by a tiny placeholder cubin (../vllm020_gpu/prune.py: size and layout kept,
#    a kernel of a dropped unit fails loudly, "invalid device function"); `prune026.py --check` proves that kept
#    entries are byte-identical and the dynamic symbols unchanged; .symtab stripped; xz with the x86 BCJ filter.
#    Left out: FA2 (sm_80; 300 MB), FlashMLA, QuTLASS, DeepGEMM, the Rust tool parser and front end (vllm-rs),
#    the spinloop and fs_io extensions (off by default / KV offloading).
# 2. vLLM's Python tree less what srcprune026.py proves the engine cannot reach (other platforms, other models,
#    serving CLI, CuTe-DSL / FA4 / DeepGEMM sources, tuning tables of other GPUs); xz -9e.
# 3. The Python packages that 0.26's engine imports and the image lacks (read from 0.26's Requires-Dist, less the
#    image's packages in /work/.library/device/KINDS.md, less what no engine process loads), cp312 manylinux wheels
#    unpacked as `pip --target` lays them out (../vllm016_gpu/unpack_wheels.py), extension modules stripped, xz.
# Needs: python3, pip with the registry, unzip, xz, zstd, readelf + strip (binutils). About 2 min on 2 cores; the
# output is the same bytes on every build (.gpub026/BUILD: their hash).
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1   # no __pycache__ left in the repo by the helper scripts
H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd)
DEST=$R/.gpub026
grep -q '^/.gpub026/$' "$R/.git/info/exclude" 2>/dev/null || echo "/.gpub026/" >> "$R/.git/info/exclude"
CACHE=${GPUB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpub}; mkdir -p "$CACHE/deps026"
NICE="nice -n 10"
WHL=$(ls "$CACHE"/vllm-0.26.0-*.whl 2>/dev/null | head -1 || true)
if [[ -z $WHL ]]; then
  $NICE python3 -m pip download -q --no-deps --only-binary=:all: vllm==0.26.0 -d "$CACHE"
  WHL=$(ls "$CACHE"/vllm-0.26.0-*.whl | head -1)
fi
XZ="xz -9e -T0"; XZBIN="xz --x86 --lzma2=preset=9e -T0"   # BCJ x86 filter: 15-30 % smaller on machine code
TAR="tar --sort=name --mtime=2026-01-01 --owner=0 --group=0 --numeric-owner"   # the same bytes on every build
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
S0=$SECONDS
rm -rf "$DEST"; mkdir -p "$DEST/so"
cd "$T"
# never unpacked: FA2 (sm_80 only, 300 MB), the Rust front end, DeepGEMM's and Blackwell attention's sources
unzip -q "$WHL" -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/deep_gemm/*' \
  'vllm/third_party/fmha_sm100/*'

# 1. kernels
LIBS="_C_stable_libtorch.abi3.so _moe_C_stable_libtorch.abi3.so _vllm_fa3_C.abi3.so cumem_allocator.abi3.so"
mkdir so orig
for f in $LIBS; do
  src=vllm/$f; [[ $f == _vllm_fa3_C* ]] && src=vllm/vllm_flash_attn/$f
  cp "$src" so/; mv "$src" orig/   # orig/: for the checks; the pruned copy travels separately (install.sh)
done
(cd so && $NICE python3 "$H/prune026.py" _C_stable_libtorch.abi3.so _moe_C_stable_libtorch.abi3.so _vllm_fa3_C.abi3.so)
for f in _C_stable_libtorch.abi3.so _moe_C_stable_libtorch.abi3.so _vllm_fa3_C.abi3.so; do
  $NICE python3 "$H/prune026.py" --check "orig/$f" "so/$f"
done
strip --strip-unneeded so/*.so
for f in $LIBS; do $NICE python3 "$H/prune026.py" --dynsym "orig/$f" "so/$f"; done
for f in $LIBS; do $NICE $XZBIN -c "so/$f" > "$DEST/so/$f.xz"; done
rm -rf so orig

# 2. vLLM's Python sources
$NICE python3 "$H/srcprune026.py" . "$R" > exclude.txt   # fails (set -e) if a pruned module would be needed at import
$TAR --exclude='__pycache__' -X exclude.txt -cf - vllm vllm-0.26.0.dist-info | $NICE $XZ > "$DEST/src.tar.xz"

# 3. dependencies the image lacks that the engine's processes import: deps.txt (README.md: how the list was found,
#    what was left out). Versions inside 0.26.0's Requires-Dist, but apache-tvm-ffi is 0.1.15.post2, not 0.26's pin
#    0.1.10 (the pin is FlashInfer's, which is not bundled; xgrammar 0.2.9 needs >= 0.1.11).
DEPS=$(grep -v '^#' "$H/deps.txt")
PLAT=""; for v in 35 34 31 28 27 26 24 17 5; do PLAT="$PLAT --platform manylinux_2_${v}_x86_64"; done
# shellcheck disable=SC2086
$NICE python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CACHE/deps026" $DEPS 2>&1 \
  | grep -v "is ignored: it is neither" || true
mkdir deps
# shellcheck disable=SC2086
$NICE python3 "$R/benchmarks/vllm016_gpu/unpack_wheels.py" "$CACHE/deps026" deps $DEPS
rm -rf deps/tvm_ffi/3rdparty/libbacktrace   # C sources of a library already linked into libtvm_ffi.so
find deps -name '*.so*' -type f | while read -r f; do
  if readelf -SW "$f" | grep -q '\.symtab'; then strip --strip-unneeded "$f"; fi   # .dynsym stays
done
(cd deps && $TAR -cf - .) | $NICE $XZBIN > "$DEST/deps.tar.xz"

# a build id: install.sh reinstalls on a warm machine only when the bundle changed
(cd "$DEST" && sha256sum so/*.xz src.tar.xz deps.tar.xz | sha256sum | cut -c1-16) > "$DEST/BUILD"
echo "built in $((SECONDS - S0)) s:"
du -b "$DEST"/so/* "$DEST"/*.tar.xz | sed "s|$R/||"
tot=$(du -cb "$DEST" | tail -1 | cut -f1)
echo "bundle .gpub026: $tot bytes = $(python3 -c "print(f'{$tot / 2**20:.2f}')") MiB (limit 20 MiB)"
[[ $tot -le $((20 * 1024 * 1024)) ]] || { echo "bundle over 20 MiB" >&2; exit 1; }
