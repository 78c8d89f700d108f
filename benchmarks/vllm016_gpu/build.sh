#!/usr/bin/env bash
# vLLM 0.16 on the lent H200, route C: vLLM 0.16.0's Python
# (scheduler, model runner, proposer, attention builders, model code: all our patches touch) on
# vLLM 0.20.0's compiled kernels (0.16's own need torch 2.9; the machine has torch 2.11).
# Every result from this engine says "route C": the C++/CUDA kernels are 0.20's.
#
#   bash benchmarks/vllm016_gpu/build.sh      # here (CPU); writes .gpub016/ (git-ignored)
#   then, on the device, with .gpub/big/so .gpub/s .gpub016 carried:
#   bash benchmarks/vllm016_gpu/install.sh    # -> /tmp/site016 (PYTHONPATH), vllm.__version__ 0.16.0
#
# Needs: the 0.20 bundle's kernels (.gpub/big/so, from bash benchmarks/vllm020_gpu/build.sh), pip with
# the registry, xz. What it takes, and why:
# * vllm-0.16.0 CUDA wheel: its Python tree and dist-info only (no .so), with
#   route_c_on_020_kernels.patch beside this script (4 files: 0.20's op schemas at three call sites,
#   0.20's `_C_stable_libtorch` imported where the ops moved), and route_c_fusion.patch: the
#   compile passes' patterns, which every engine with compilation registers, name two ops whose
#   schemas changed: per_token_group_fp8_quant (two new arguments) and the nvfp4 quant ops (sm_100+
#   only; their patterns are left out). Found on the H200, 2026-12-03. Both must apply cleanly.
# * 0.16's Python dependencies that the machine's image lacks or has at another major version
#   (transformers 5 / huggingface-hub 1 / tokenizers 0.23 there; 0.16 needs transformers < 5), at
#   the versions `ci/engine.sh vllm016` resolved for vLLM 0.16.0's requirements, cp312 wheels.
#   The list is the distributions whose modules an engine's imports load in that venv (read
#   with importlib.metadata.packages_distributions()) less the image's packages (KINDS.md).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${VLLM_K2_CACHE:-$HOME/.cache/vllm-k2-plugin}/gpu-vllm016
DEST=$REPO/.gpub016
PATCH=$REPO/benchmarks/vllm016_gpu/route_c_on_020_kernels.patch
[[ -d $REPO/.gpub/big/so ]] || { echo "no .gpub/big/so: run bash benchmarks/vllm020_gpu/build.sh first" >&2; exit 2; }
[[ -f $PATCH ]] || { echo "missing $PATCH" >&2; exit 2; }
grep -q '^/.gpub016/$' "$REPO/.git/info/exclude" 2>/dev/null || echo "/.gpub016/" >> "$REPO/.git/info/exclude"
mkdir -p "$CACHE/deps"
WHL=$(ls "$CACHE"/vllm-0.16.0-*.whl 2>/dev/null | head -1 || true)
if [[ -z $WHL ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: vllm==0.16.0 -d "$CACHE"
  WHL=$(ls "$CACHE"/vllm-0.16.0-*.whl | head -1)
fi
DEPS="transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2 xgrammar==0.1.29 compressed-tensors==0.13.0
  loguru==0.7.3 diskcache==5.6.3 interegular==0.3.3 lm-format-enforcer==0.11.3 mistral-common==1.13.1
  pycountry==26.2.16 pydantic-extra-types==2.11.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  referencing==0.37.0 rpds-py==2026.9.1 python-multipart==0.0.34 email-validator==2.4.0 dnspython==2.9.2
  depyf==0.20.0 astor==0.8.1 dill==0.4.1 blake3==1.0.11 lark==1.2.2 outlines-core==0.2.11
  annotated-types==0.8.0 annotated-doc==0.0.7 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.165.0 gguf==0.19.0
  llguidance==1.3.0 msgspec==0.23.0 openai==3.60.0 httpx2==2.16.2 jiter==0.19.0 openai-harmony==0.0.8
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0
  setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 typing-extensions==4.16.0 typing-inspection==0.4.5
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
rm -rf "$DEST"; mkdir -p "$DEST"
(cd "$T" && unzip -q "$WHL" -x '*.so' && patch -s -p1 --forward --no-backup-if-mismatch < "$PATCH" \
  && patch -s -p1 --forward --no-backup-if-mismatch < "$REPO/benchmarks/vllm016_gpu/route_c_fusion.patch")
tar -C "$T" --exclude='__pycache__' --exclude='vllm-0.16.0.dist-info/RECORD' -cf - vllm vllm-0.16.0.dist-info \
  | xz -9 -T0 > "$DEST/src.tar.xz"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$CACHE/deps" $DEPS 2>&1 \
  | grep -v "is ignored: it is neither" || true
mkdir -p "$T/deps"
# shellcheck disable=SC2086
python3 "$REPO/benchmarks/vllm016_gpu/unpack_wheels.py" "$CACHE/deps" "$T/deps" $DEPS
for f in $(find "$T/deps" -name '*.so'); do strip --strip-unneeded "$f" 2>/dev/null || true; done  # .dynsym stays
(cd "$T/deps" && tar -cf - .) | xz -9 -T0 > "$DEST/deps.tar.xz"
du -b "$DEST"/*.tar.xz | sed "s|$REPO/||"
