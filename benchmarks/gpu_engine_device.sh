#!/usr/bin/env bash
# On the lent H200 (device tool, repo root, with .gpub/big .gpub/s .gpub/e2e carried): vLLM 0.20
# from the bundle (benchmarks/vllm020_gpu/README.md) with this package installed into it, then
# the steps named: pytest (GPU tests of the MLA kernel and backend, drafter attention) and e2e suites
# (tiny, slice, slice-k; see gpu_engine_e2e.py), moebench (moe_verify_bench.py), dattn
# (draft_attention_tile_probe.py), prefill (prefill_throughput.py), rope
# (rope_cache_probe.py), quantmoe (quant_moe/run.py). Each suite's results come back as one tgz.
#   bash benchmarks/gpu_engine_device.sh pytest tiny:8 slice:2
#   ONLY="case-name ..." bash benchmarks/gpu_engine_device.sh dgprof   (only those cases of the suites)
#   ENGINE=vllm016 bash benchmarks/gpu_engine_device.sh v16tiny        (vLLM 0.16, route C: carry .gpub/big/so
#                                                   .gpub/s .gpub016 .gpub/e2e; benchmarks/vllm016_gpu/build.sh)
#   ENGINE=vllm016 ROUTE=B ...                     (route B: route C's carry and .gpub016b;
#                                                   benchmarks/vllm016_gpu/build.sh, then build_route_b.sh)
#   ENGINE=vllm026 bash benchmarks/gpu_engine_device.sh tiny:8   (vLLM 0.26.0 with its own kernels: carry .gpub026
#                                                   .gpub/e2e; benchmarks/vllm026_gpu/build.sh, README.md there)
set -u
ENGINE=${ENGINE:-vllm020}
ROUTE=${ROUTE:-C}  # vllm016 only: C (build.sh) or B (build_route_b.sh: carry .gpub016b as well)
case $ENGINE$ROUTE in vllm016B|vllm016C|vllm020C|vllm026C) ;; *) echo "ROUTE=$ROUTE is for ENGINE=vllm016 (B or C)" >&2; exit 2 ;; esac
SITE=/tmp/site; [ "$ENGINE" = vllm016 ] && SITE=/tmp/site016; [ "$ENGINE$ROUTE" = vllm016B ] && SITE=/tmp/site016b
[ "$ENGINE" = vllm026 ] && SITE=/tmp/site026 && export E2E_ENGINE_ROUTE="vLLM 0.26.0 (its own kernels)" \
  VLLM_USE_FLASHINFER_SAMPLER=0  # the 0.26 bundle has no FlashInfer: vLLM's own sampler
[ "$ENGINE$ROUTE" = vllm016C ] && export E2E_ENGINE_ROUTE="route C: vLLM 0.16.0's Python on vLLM 0.20.0's kernels"
[ "$ENGINE$ROUTE" = vllm016B ] && export E2E_ENGINE_ROUTE="route B: vLLM 0.16.0's Python and kernels (a subset, \
built for torch 2.11), vLLM 0.20.0's FlashAttention"
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1  # $PWD: vllm_k2_tools (the tools distribution) beside the installed plugin
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DGPU_BACKENDS=TRITON_MLA,TRITON_ATTN  # the bundle's plugin: MLA layers TRITON_MLA, others TRITON_ATTN
OUT=${OUT:-/tmp/out}; WORK=/tmp/e2e-work; mkdir -p "$OUT" "$WORK"
S0=$SECONDS; BUDGET=${BUDGET:-560}
if [ "$ENGINE" = vllm016 ]; then
  ROUTE=$ROUTE SITE016=$SITE bash benchmarks/vllm016_gpu/install.sh > "$OUT/install.log" 2>&1 \
    || { tail -25 "$OUT/install.log"; exit 1; }
  grep "^install016: vllm" "$OUT/install.log"
elif [ "$ENGINE" = vllm026 ]; then
  SITE026=$SITE bash benchmarks/vllm026_gpu/install.sh > "$OUT/install.log" 2>&1 || { tail -25 "$OUT/install.log"; exit 1; }
  grep "^install026: vllm" "$OUT/install.log"
else
  bash .gpub/s/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
for step in "$@"; do
  left=$((BUDGET - (SECONDS - S0)))
  case $step in
    pytest|pytest:*)  # pytest:FILE,FILE runs only those files' gpu tests
      files="tests/test_mla_kernel.py tests/test_mla_backend.py tests/test_draft_attention.py tests/test_moe_verify.py tests/test_rope_cache.py"
      [ "$step" != pytest ] && files=$(echo "${step#pytest:}" | tr , ' ')
      # shellcheck disable=SC2086
      timeout $((left > 150 ? 150 : left)) python3 -m pytest -q -m gpu -p no:cacheprovider $files \
        > "$OUT/pytest.log" 2>&1
      tail -15 "$OUT/pytest.log" ;;
    dattn)  # vLLM's TRITON_ATTN 3D decode kernel by tile and segments at the drafter's TP-8 shape
      # shellcheck disable=SC2086
      timeout $((left > 150 ? 150 : left)) python3 benchmarks/draft_attention_tile_probe.py \
        --out "$OUT/dattn_tile_probe.json" ${DATTN_ARGS:-} > "$OUT/dattn.log" 2>&1
      tail -4 "$OUT/dattn.log" ;;
    prefill)  # prefill tokens/s of the 24-layer slice (the planner's calibration, issue 39 item 5)
      timeout $((left > 200 ? 200 : left)) python3 benchmarks/prefill_throughput.py --model .gpub/e2e/slice24 \
        --seq 2048 --batch 8 --out "$OUT/prefill_h200.json" > "$OUT/prefill.log" 2>&1
      grep -E '"(tokens_per_s|efficiency|achieved_tflops)"' "$OUT/prefill.log" || tail -5 "$OUT/prefill.log" ;;
    quantmoe|quantmoe:*)  # vLLM's MoE kernels for quantized experts vs their floor, ours beside (QUANT_MOE_ARGS)
      # shellcheck disable=SC2086
      timeout $((left > 240 ? 240 : left)) python3 benchmarks/quant_moe/run.py --out "$OUT/quant_moe.json" \
        --budget $((left > 240 ? 200 : left - 40)) ${QUANT_MOE_ARGS:-} > "$OUT/quant_moe.log" 2>&1
      grep -E "^(device|TOTAL)|ERROR" "$OUT/quant_moe.log" | head -20 ;;
    rope)  # vLLM's CUDA rotary op with a bf16 vs float32 cos/sin cache (why rope-float32-cache exists)
      timeout $((left > 120 ? 120 : left)) python3 benchmarks/rope_cache_probe.py \
        --out "$OUT/rope_cache_probe.json" > "$OUT/rope.log" 2>&1
      tail -12 "$OUT/rope.log" ;;
    moebench)
      timeout $((left > 120 ? 120 : left)) python3 benchmarks/moe_verify_bench.py --out "$WORK/moe_verify_h200" \
        > "$OUT/moebench.log" 2>&1
      tail -14 "$OUT/moebench.log"
      tar czf "$OUT/moebench.tgz" -C "$WORK" moe_verify_h200 ;;  # few files come back: one archive
    *)
      suite=${step%%:*}; par=${step#*:}; [ "$par" = "$step" ] && par=1
      echo "== suite $suite (parallel $par, ${left}s left)"
      rm -rf "${WORK:?}/$suite"  # a warm machine keeps the last call's cases: only this call's come back
      python3 benchmarks/gpu_engine_e2e.py run "$suite" --models .gpub/e2e --out "$WORK/$suite" \
        --parallel "$par" --budget $((left - 15)) ${ONLY:+--only $ONLY} 2>&1 | tee "$OUT/$suite.log" | grep -E "^(CASE|==|SKIP)"
      rc=${PIPESTATUS[0]}
      tar czf "$OUT/$suite.tgz" -C "$WORK" "$suite"
      [ "$rc" = 3 ] && { echo "suite $suite: no engine came up; later steps not run"; break; } ;;
  esac
done
echo "TOTAL $((SECONDS - S0)) s"
