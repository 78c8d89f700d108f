#!/usr/bin/env bash
# One device call (lent H200, .gpub/big .gpub/s carried; repo root): the all-reduce patch with ranks sharing
# the GPU (benchmarks/comm_shared_gpu.py) beside an engine that is expected to hang (OpenMP workers started
# before vLLM forks its core, plugin off), then engines that must come up: every patch with the fixture
# built in the same process, and the hang's work-around (spawn).
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DGPU_BACKENDS=TRITON_MLA,TRITON_ATTN
OUT=${OUT:-/tmp/out}; W=/tmp/cs; rm -rf "$W"; mkdir -p "$OUT" "$W/comm" "$W/hang" "$W/up"
bash .gpub/s/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
R=benchmarks/engine_startup/run.py
python3 $R --out "$W/hang" --deadline 150 "omp-plugin-off=ENGINE_STARTUP_OMP_BEFORE=1;VLLM_K2_DISABLE=1" > "$W/hang/runner.log" 2>&1 &
hang=$!
timeout 300 python3 benchmarks/comm_shared_gpu.py --out "$W/comm" 2 4 8 4:wrong 4:slow 2>&1 | grep -v Warning | tail -20
wait $hang; grep VARIANT "$W/hang/runner.log"
python3 $R --out "$W/up" --deadline 170 --sequential --fresh-fixture "all-patches=" \
  "omp-spawn=ENGINE_STARTUP_OMP_BEFORE=1;VLLM_WORKER_MULTIPROC_METHOD=spawn" 2>&1 | grep VARIANT
tar czf "$OUT/comm_startup.tgz" -C "$W" --exclude="target*" .
