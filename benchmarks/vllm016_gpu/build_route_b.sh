#!/usr/bin/env bash
# vLLM 0.16 on the lent H200, route B: 0.16.0's own C++/CUDA kernels,
# compiled here (CPU, no GPU needed) against torch 2.11.0+cu130 (the device's torch) for sm_90a only.
# Route C (build.sh) runs 0.16's Python on 0.20's kernels; route B swaps in 0.16's own _C, _moe_C and
# cumem_allocator, keeping 0.20's FlashAttention (.gpub/big/so: vllm-flash-attn is its own project).
# Route B is route C's carry plus .gpub016b (~2 MiB), so one device call can run either.
#
#   nice bash benchmarks/vllm016_gpu/build.sh && nice bash benchmarks/vllm016_gpu/build_route_b.sh
#       -> .gpub016b/ (git-ignored): the kernels (.so.xz), route C's two patches, dropped_ops.txt; resumable
#   then, on the device, with .gpub016b carried as well: ROUTE=B bash benchmarks/vllm016_gpu/install.sh
#
# Only a subset is compiled (route_b_tree.py says why and how); ops outside it are not registered, and
# the list of those is written beside the kernels (dropped_ops.txt). Not for fp8/int4 GEMM checkpoints.
# Needs: network for PyPI (vllm-0.16.0 sdist, torch 2.11.0 and its CUDA 13.0.2 packages, nvcc 13.0.88,
# nvidia-cutlass 4.2.0.0 headers, cmake, ninja), python3.12, gcc. ~7 GB in the cache; from scratch
# 46 min on 2 cores shared with a test suite (one run under `time`, 2026-12-04; not in a results file).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${VLLM_K2_CACHE:-$HOME/.cache/vllm-k2-plugin}/gpu-vllm016-routeb
DEST=$REPO/.gpub016b
PY312=${PY312:-python3.12}  # any CPython 3.12 (the device's); a pyenv install where the shim has none active
"$PY312" -c "" 2>/dev/null || PY312=$(ls "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.12*/bin/python3.12 | tail -1)
SDIST_URL=https://files.pythonhosted.org/packages/e6/fa/ab31c88afd21b69a46c3cc80d4017a2d5045a30cc4862dba6eae6eca7865/vllm-0.16.0.tar.gz
SDIST_SHA=1f684bb31fbef59d862e2fe666e23a41f1d39d93f86215ce1ce1db89a8f5665b
JOBS=${JOBS:-2}
[[ -f $REPO/.gpub016/src.tar.xz ]] || { echo "no .gpub016/src.tar.xz: run benchmarks/vllm016_gpu/build.sh first" >&2; exit 2; }

# The subset: every op a bf16 DeepSeek-V3 engine (MLA, grouped top-k MoE) reaches, the cache/utility
# ops, the quant ops the compile passes name in their patterns, the GGUF kernels, and the small
# CUTLASS entry points (their "supported?" queries answer no without the GEMMs).
C_SRC="csrc/cache_kernels.cu csrc/cache_kernels_fused.cu csrc/attention/merge_attn_states.cu
  csrc/pos_encoding_kernels.cu csrc/activation_kernels.cu csrc/layernorm_kernels.cu
  csrc/fused_qknorm_rope_kernel.cu csrc/layernorm_quant_kernels.cu csrc/sampler.cu csrc/cuda_view.cu
  csrc/quantization/w8a8/int8/scaled_quant.cu csrc/quantization/w8a8/fp8/common.cu
  csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu
  csrc/quantization/gguf/gguf_kernel.cu csrc/quantization/activation_kernels.cu csrc/cuda_utils_kernels.cu
  csrc/custom_all_reduce.cu csrc/permute_cols.cu csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu
  csrc/quantization/fp4/nvfp4_quant_entry.cu csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu
  csrc/sparse/cutlass/sparse_scaled_mm_entry.cu csrc/cutlass_extensions/common.cpp
  csrc/quantization/w8a8/fp8/per_token_group_quant.cu csrc/quantization/w8a8/int8/per_token_group_quant.cu
  csrc/torch_bindings.cpp"
MOE_SRC="csrc/moe/torch_bindings.cpp csrc/moe/moe_align_sum_kernels.cu csrc/moe/topk_softmax_kernels.cu
  csrc/moe/grouped_topk_kernels.cu csrc/moe/permute_unpermute_kernels/moe_permute_unpermute_kernel.cu
  csrc/moe/moe_permute_unpermute_op.cu"

mkdir -p "$CACHE"
cd "$CACHE"
if [[ ! -f sdist.ok ]]; then
  curl -sSfL -o vllm-0.16.0.tar.gz "$SDIST_URL"
  echo "$SDIST_SHA  vllm-0.16.0.tar.gz" | sha256sum -c --quiet
  touch sdist.ok
fi
if [[ ! -f venv.ok ]]; then  # torch as on the device; nvcc etc. from the same CUDA 13.0.2 release
  rm -rf venv && "$PY312" -m venv venv
  venv/bin/pip install -q torch==2.11.0 "cuda-toolkit[nvcc,cccl,cudart,crt,nvvm,culibos,profiler]==13.0.2" \
    nvidia-cutlass==4.2.0.0 "cmake>=3.26,<4" ninja jinja2 packaging setuptools wheel 2>&1 | grep -v "is ignored" || true
  venv/bin/python -c "import torch; assert torch.__version__.startswith('2.11.0') and torch.version.cuda == '13.0'"
  touch venv.ok
fi
SITE=$(venv/bin/python -c "import site; print(site.getsitepackages()[0])")
CUDA=$CACHE/cuda  # a toolkit root as CMake and nvcc expect it (PyPI's layout is nvidia/cu13/{bin,include,lib})
if [[ ! -f cuda.ok ]]; then
  rm -rf cuda && mkdir -p cuda/lib64/stubs
  cp -r "$SITE/nvidia/cu13/bin" cuda/bin           # a copy: nvcc finds its lib64/ and nvvm/ beside its own path
  ln -s "$SITE/nvidia/cu13/include" cuda/include
  ln -s "$SITE/nvidia/cu13/nvvm" cuda/nvvm
  for f in "$SITE"/nvidia/cu13/lib/*; do
    b=$(basename "$f"); ln -sf "$f" "cuda/lib64/$b"
    [[ $b == *.so.* ]] && ln -sf "$f" "cuda/lib64/${b%%.so.*}.so"
  done
  echo "" | gcc -x c -shared -Wl,-soname,libcuda.so.1 -o cuda/lib64/stubs/libcuda.so -  # for configure; see below
  touch cuda.ok
fi
if [[ ! -f tree.ok ]]; then
  rm -rf vllm-0.16.0 build && tar xzf vllm-0.16.0.tar.gz
  venv/bin/python "$REPO/benchmarks/vllm016_gpu/route_b_tree.py" cmake vllm-0.16.0
  touch tree.ok
fi
if [[ ! -f build/build.ninja ]]; then
  PATH=$CUDA/bin:$CACHE/venv/bin:$PATH CUDA_HOME=$CUDA TORCH_CUDA_ARCH_LIST=9.0a VLLM_CUTLASS_SRC_DIR=$SITE/cutlass_library/source \
    venv/bin/cmake -S vllm-0.16.0 -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLLM_TARGET_DEVICE=cuda \
    -DVLLM_PYTHON_EXECUTABLE="$CACHE/venv/bin/python" -DCMAKE_CUDA_COMPILER="$CUDA/bin/nvcc" \
    -DCUDAToolkit_ROOT="$CUDA" -DNVCC_THREADS=1 -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DCUTLASS_INCLUDE_DIR="$SITE/cutlass_library/source/include" \
    -DCUTLASS_TOOLS_UTIL_INCLUDE_DIR="$SITE/cutlass_library/source/tools/util/include" \
    -DVLLM_K2_EXT_SRC="$(echo $C_SRC | tr ' ' ';')" -DVLLM_K2_MOE_EXT_SRC="$(echo $MOE_SRC | tr ' ' ';')" \
    > configure.log 2>&1 || { tail -30 configure.log; exit 1; }
fi
export PATH=$CUDA/bin:$CACHE/venv/bin:$PATH
# 1. every object but the bindings; 2. bindings keep what those objects define; 3. link
OBJS=$(ninja -C build -t targets all | sed -n 's/^\(CMakeFiles\/\(_C\|_moe_C\|cumem_allocator\)\.dir\/[^:]*\.o\): .*/\1/p' \
  | grep -v torch_bindings)
# shellcheck disable=SC2086
nice ninja -C build -j "$JOBS" $OBJS
OBJ_PATHS=$(sed 's|^|build/|' <<< "$OBJS")
# the driver at link time: a stand-in exporting what the objects import, so the linker (--as-needed)
# records libcuda.so.1 as needed; the device's driver provides the real functions
# shellcheck disable=SC2086
venv/bin/python "$REPO/benchmarks/vllm016_gpu/route_b_check.py" stand-in cuda/lib64/stubs/libcuda.so $OBJ_PATHS
tar xzf vllm-0.16.0.tar.gz vllm-0.16.0/csrc/torch_bindings.cpp vllm-0.16.0/csrc/moe/torch_bindings.cpp  # as released
# shellcheck disable=SC2086
venv/bin/python "$REPO/benchmarks/vllm016_gpu/route_b_tree.py" bindings vllm-0.16.0 $OBJ_PATHS | tee dropped_ops.txt
nice ninja -C build -j "$JOBS" _C _moe_C cumem_allocator
venv/bin/python "$REPO/benchmarks/vllm016_gpu/route_b_check.py" build vllm-0.16.0 | tee -a dropped_ops.txt
rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp"
for so in _C _moe_C cumem_allocator; do
  f=$(ls build/$so.*.so | head -1)
  strip --strip-unneeded -o "$DEST.tmp/$(basename "$f")" "$f"
  xz -9 -T0 -f "$DEST.tmp/$(basename "$f")"
done
cp dropped_ops.txt "$DEST.tmp/"
# 0.16.0's Python as released: install.sh takes route C's tree (.gpub016/src.tar.xz) back through
# these two patches (route C's schema edits are for 0.20's kernels); FlashAttention stays 0.20's.
cp "$REPO/benchmarks/vllm016_gpu/route_c_on_020_kernels.patch" "$REPO/benchmarks/vllm016_gpu/route_c_fusion.patch" "$DEST.tmp/"
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
grep -q '^/.gpub016b/$' "$REPO/.git/info/exclude" 2>/dev/null || echo "/.gpub016b/" >> "$REPO/.git/info/exclude"
du -b "$DEST"/* | sed "s|$REPO/||"
# the committed record of this build and its check (written here only; atomically)
RESULT=$REPO/benchmarks/results/vllm016_route_b/build_check.txt
mkdir -p "$(dirname "$RESULT")"
{
  echo "# written by: bash benchmarks/vllm016_gpu/build_route_b.sh (JOBS=$JOBS), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# machine: $(nproc) cores, $(uname -m), no GPU; this run ${SECONDS} s (objects already built are reused)"
  echo "# torch $(venv/bin/python -c 'import torch; print(torch.__version__)'), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), vLLM sdist sha256 $SDIST_SHA"
  cat dropped_ops.txt
  du -b "$DEST"/*.so.xz | sed "s|$REPO/||"
} > "$RESULT.tmp" && mv "$RESULT.tmp" "$RESULT"
