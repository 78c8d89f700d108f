#!/usr/bin/env bash
# On the device (repo root; .gpub026 carried, from benchmarks/vllm026_gpu/build.sh): vLLM 0.26.0 with its own
# kernels in $SITE026 (default /tmp/site026; put it on PYTHONPATH), with the backend-picking plugin of the 0.20 bundle
# (benchmarks/vllm020_gpu/device/plugin: DGPU_BACKENDS=TRITON_MLA,TRITON_ATTN) and this repo's package.
#   bash benchmarks/vllm026_gpu/install.sh      # ends with "install026: vllm 0.26.0 ..."
# A warm machine keeps $SITE026: it is unpacked again only when .gpub026/BUILD differs. ~5 s.
set -euo pipefail
SITE=${SITE026:-/tmp/site026}; B=.gpub026
for f in $B/BUILD $B/src.tar.xz $B/deps.tar.xz $B/so/_C_stable_libtorch.abi3.so.xz $B/so/_moe_C_stable_libtorch.abi3.so.xz \
         $B/so/_vllm_fa3_C.abi3.so.xz $B/so/cumem_allocator.abi3.so.xz; do
  [[ -e $f ]] || { echo "install026: missing $f (carry .gpub026; build it with benchmarks/vllm026_gpu/build.sh)" >&2; exit 2; }
done
if [[ -f $SITE/.ready && $(cat "$SITE/.ready") == $(cat $B/BUILD) ]]; then
  echo "install026: bundle $(cat $B/BUILD) already there"
else
  t=$SECONDS
  rm -rf "$SITE"; mkdir -p "$SITE"
  python3 "$(dirname "$0")/unpack.py" "$SITE" "$B"
  # the bundled typing_extensions only if the image's is older than pydantic 2.12 needs (as the 0.20 bundle does)
  if PYTHONPATH= python3 -c "import importlib.metadata as m,sys; from packaging.version import Version as V; \
sys.exit(0 if V(m.version('typing_extensions'))>=V('4.14.1') else 1)"; then
    rm -rf "$SITE"/typing_extensions.py "$SITE"/typing_extensions-*.dist-info
  fi
  cp -r benchmarks/vllm020_gpu/device/plugin/* "$SITE/"
  cat $B/BUILD > "$SITE/.ready"
  echo "install026: unpacked in $((SECONDS - t)) s, $(du -sh "$SITE" | cut -f1)"
fi
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . \
  || { echo "install026: pip could not install the repo's package into $SITE" >&2; exit 1; }
echo "install026: repo package installed"
PYTHONPATH=$SITE python3 - <<'PY'
import torch, transformers, vllm, vllm._C_stable_libtorch, vllm._moe_C_stable_libtorch
assert vllm.__version__.startswith("0.26"), vllm.__version__
print(f"install026: vllm {vllm.__version__} (its own kernels, sm_90 subset), torch {torch.__version__}, "
      f"transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
PY
