#!/usr/bin/env bash
# On the lent H200 (device tool, repo root, .gpub/big .gpub/s carried): the vLLM 0.20 bundle with this
# package installed, the probe of what each patch does to the LLM process, then engines side by side.
#   bash benchmarks/engine_startup/device.sh DEADLINE VARIANT...   (variants as run.py takes them)
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DGPU_BACKENDS=TRITON_MLA,TRITON_ATTN
OUT=${OUT:-/tmp/out}; W=/tmp/startup; rm -rf "$W"; mkdir -p "$OUT" "$W"
bash .gpub/s/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
deadline=$1; shift
[ "${PROBE:-1}" = 1 ] && timeout 120 python3 benchmarks/engine_startup/run.py probe "$W/probe.json" > "$W/probe.log" 2>&1
echo "probe rc=$?"
python3 - "$W/probe.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except Exception as e:
    print("no probe result", e); sys.exit()
prev = None
for k, v in s.items():
    cur = (v["cuInit_done"], v["primary_ctx_active"], v["torch_cuda_initialized"], tuple(v["threads"]))
    if cur != prev:
        print(f"{k}: cuInit={v['cuInit_done']} ctx={v['primary_ctx_active']} torch_init={v['torch_cuda_initialized']} threads={v['threads']}")
    prev = cur
PY
python3 benchmarks/engine_startup/run.py --out "$W" --deadline "$deadline" "$@"
for d in "$W"/*/; do n=$(basename "$d"); case $n in target*) continue;; esac
  ls "$d"stack-*.txt >/dev/null 2>&1 && grep -l . "$d"stack-*.txt >/dev/null && echo "== stacks of $n: $(ls "$d" | wc -l) files"; done
tar czf "$OUT/startup.tgz" -C "$W" --exclude="target*" .
