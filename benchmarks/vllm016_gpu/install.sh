#!/usr/bin/env bash
# On the device (repo root; .gpub/big/so, .gpub/s and .gpub016 carried): vLLM 0.16.0's Python in
# $SITE016 (put it on PYTHONPATH), with the bundle's backend-picking plugin and this repo's package,
# on one of two sets of kernels:
#   ROUTE=C (default): vLLM 0.20.0's kernels, 0.16's Python patched for their schemas (build.sh)
#   ROUTE=B (.gpub016b carried too): 0.16.0's own _C / _moe_C / cumem_allocator, a subset built for
#           torch 2.11 (build_route_b.sh), route C's patches taken back out; 0.20.0's FlashAttention
set -euo pipefail
ROUTE=${ROUTE:-C}
case $ROUTE in
  C) SITE=${SITE016:-/tmp/site016}; need=".gpub016/deps.tar.xz .gpub016/src.tar.xz .gpub/big/so" ;;
  B) SITE=${SITE016:-/tmp/site016b}; need=".gpub016/deps.tar.xz .gpub016/src.tar.xz .gpub/big/so .gpub016b/_C.abi3.so.xz" ;;
  *) echo "install016: ROUTE must be B or C, not '$ROUTE'" >&2; exit 2 ;;
esac
for f in $need; do [[ -e $f ]] || { echo "install016: route $ROUTE needs $f (carry it)" >&2; exit 2; }; done
if [[ -f $SITE/.ready ]]; then
  echo "install016: already there"
else
  t=$SECONDS
  rm -rf "$SITE"; mkdir -p "$SITE"
  KERNELS=".gpub/big/so/*.xz"  # route B: 0.20's FlashAttention only, the rest 0.16's own
  [[ $ROUTE == B ]] && KERNELS=".gpub/big/so/_vllm_fa3_C.abi3.so.xz .gpub016b/*.so.xz"
  # shellcheck disable=SC2086
  python3 - "$SITE" $KERNELS <<'PY'
import lzma, os, shutil, sys, tarfile
site = sys.argv[1]
for t in ("deps", "src"):
    tarfile.open(f".gpub016/{t}.tar.xz").extractall(site, filter="fully_trusted")
for f in sys.argv[2:]:  # compiled extensions, where 0.16's Python loads its own
    name = os.path.basename(f)[:-3]
    dst = os.path.join(site, "vllm", "vllm_flash_attn" if "fa3" in name else "", name)
    with lzma.open(f) as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 24)
    os.chmod(dst, 0o755)
PY
  if [[ $ROUTE == B ]]; then  # 0.16.0's Python as released: both patches must come back out cleanly
    for p in route_c_fusion.patch route_c_on_020_kernels.patch; do
      patch -s -R -p1 --no-backup-if-mismatch -d "$SITE" < ".gpub016b/$p" \
        || { echo "install016: route B: $p does not reverse on route C's tree" >&2; exit 1; }
    done
  fi
  cp -r .gpub/s/plugin/* "$SITE/"
  touch "$SITE/.ready"
  echo "install016: done in $((SECONDS - t)) s, $(du -sh "$SITE" | cut -f1)"
fi
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . \
  && echo "install016: repo package installed"
PYTHONPATH=$SITE ROUTE=$ROUTE python3 - <<'PY'
import os
import torch, transformers, vllm, vllm._C, vllm._moe_C
assert vllm.__version__.startswith("0.16"), vllm.__version__
kernels = {"C": "0.20.0's kernels", "B": "0.16.0's own kernels (subset) + 0.20.0's FlashAttention"}[os.environ["ROUTE"]]
print(f"install016: vllm {vllm.__version__} (route {os.environ['ROUTE']}: {kernels}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
PY
