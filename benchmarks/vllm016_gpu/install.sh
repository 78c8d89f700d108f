#!/usr/bin/env bash
# On the device (repo root; .gpub/big/so, .gpub/s and .gpub016 carried): vLLM 0.16.0's Python on
# vLLM 0.20.0's kernels (route C, see build.sh) in /tmp/site016, with the bundle's backend-picking
# plugin and this repo's package. Put /tmp/site016 on PYTHONPATH.
set -euo pipefail
SITE=${SITE016:-/tmp/site016}
if [[ -f $SITE/.ready ]]; then
  echo "install016: already there"
else
  t=$SECONDS
  rm -rf "$SITE"; mkdir -p "$SITE"
  python3 - "$SITE" <<'PY'
import glob, lzma, os, shutil, sys, tarfile
site = sys.argv[1]
for t in ("deps", "src"):
    tarfile.open(f".gpub016/{t}.tar.xz").extractall(site, filter="fully_trusted")
for f in glob.glob(".gpub/big/so/*.xz"):  # 0.20's kernels where 0.16's Python loads its own
    name = os.path.basename(f)[:-3]
    dst = os.path.join(site, "vllm", "vllm_flash_attn" if "fa3" in name else "", name)
    with lzma.open(f) as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 24)
    os.chmod(dst, 0o755)
PY
  cp -r .gpub/s/plugin/* "$SITE/"
  touch "$SITE/.ready"
  echo "install016: done in $((SECONDS - t)) s, $(du -sh "$SITE" | cut -f1)"
fi
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . \
  && echo "install016: repo package installed"
PYTHONPATH=$SITE python3 - <<'PY'
import importlib.metadata as md
import torch, transformers, vllm, vllm._C, vllm._moe_C
assert vllm.__version__.startswith("0.16"), vllm.__version__
print(f"install016: vllm {vllm.__version__} (route C: 0.20.0's kernels), torch {torch.__version__}, "
      f"transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
PY
