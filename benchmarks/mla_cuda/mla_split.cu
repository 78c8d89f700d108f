// Split-KV MLA decode, stage 1, hand-pipelined with mma.sync (bf16 latent, 576 = 512 + 64).
// A probe of whether explicit operand scheduling closes the gap the Triton split kernel
// leaves (its profile: each MMA waits on the ldmatrix just before it). Same contract and
// workspace layout as vllm_k2_plugin/mla/kernel.py's mla_decode_split (not DIRECT), so the
// Triton reduce merges its partials.
//
// One CTA (4 warps) per (split, request); its 16 rows are (query token, head) pairs.
// Scores: warp w sums dims [144w, 144w + 144) for every token of the tile; the four partial
// score tiles meet in shared memory. Output: warp w owns latent dims [128w, 128w + 128).
// Tiles arrive by cp.async, STAGES deep.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#ifndef KERNEL_ONLY  // KERNEL_ONLY: compile the kernel alone (ptxas report without torch's headers)
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

constexpr int D = 576;
constexpr int DV = 512;
constexpr int ROW = D + 8;           // smem row pitch in elements: 1168 B, 73 x 16 B (ldmatrix conflict-free)
constexpr int ROWS = 16;             // one m16 tile of (token, head) rows
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int KSTEPS_QK = D / WARPS / 16;   // 9 k16 steps per warp
constexpr int NT_PV = DV / WARPS / 8;       // 16 n8 tiles of output dims per warp
constexpr float NEG_BIG = -1.0e30f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  int n = ok ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Bulk copies (sm_90): one instruction moves a whole latent row; an mbarrier counts the bytes.
__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar));
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n K2_WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra K2_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int BLOCK_N, int STAGES, bool LOAD_ONLY = false, bool BULK = false>
__global__ void __launch_bounds__(THREADS) mla_split_kernel(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv, const int* __restrict__ block_table,
    const int* __restrict__ seq_lens, float* __restrict__ ws_out, float* __restrict__ ws_lse, float scale_log2,
    int64_t stride_q_tok, int64_t stride_q_head, int64_t stride_kv_page, int64_t stride_kv_tok, int64_t stride_bt,
    int num_heads, int q_len, int num_splits, int page_shift) {
  constexpr int NT = BLOCK_N / 8;       // n8 tiles of tokens
  constexpr int KP = BLOCK_N / 16;      // k16 steps of P . V
  constexpr int CHUNKS = BLOCK_N * (D / 8);  // 16-byte pieces per tile
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* skv = sq + ROWS * ROW;
  float* ss = reinterpret_cast<float*>(skv + STAGES * BLOCK_N * ROW);  // [WARPS][NT][32 lanes] float4
  __shared__ __align__(8) uint64_t bars[STAGES];  // BULK: one per stage

  const int split = blockIdx.x, req = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int rows = q_len * num_heads;
  const int seq = seq_lens[req];
  const int split_len = ((seq + num_splits - 1) / num_splits + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
  const int start = split * split_len;
  const int end = min(start + split_len, seq);
  const int* bt = block_table + (int64_t)req * stride_bt;

  // Q rows -> smem (rows past q_len x heads are zeros)
  for (int c = tid; c < ROWS * (D / 8); c += THREADS) {
    int r = c / (D / 8), col = (c % (D / 8)) * 8;
    bool ok = r < rows;
    int tok = ok ? r / num_heads : 0, head = ok ? r % num_heads : 0;
    const __nv_bfloat16* src = q + ((int64_t)req * q_len + tok) * stride_q_tok + head * stride_q_head + col;
    cp_async16(smem_u32(sq + r * ROW + col), ok ? src : q, ok);
  }
  if (BULK) {
    if (tid == 0) {
      for (int st = 0; st < STAGES; ++st) mbar_init(smem_u32(&bars[st]));
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
  }
  // A tile spans at most MAXP pages (pages are >= 16 tokens and tiles start at multiples of
  // BLOCK_N). Their ids are read one tile ahead, so no cp.async waits on a block-table load.
  constexpr int MAXP = BLOCK_N >= 16 ? BLOCK_N / 16 : 1;
  const int tiles = end > start ? (end - start + BLOCK_N - 1) / BLOCK_N : 0;
  auto fetch_pages = [&](int ti, int* dst) {
    const int first = (start + ti * BLOCK_N) >> page_shift;
#pragma unroll
    for (int p = 0; p < MAXP; ++p) {
      int idx = first + p;
      dst[p] = (ti < tiles && (idx << page_shift) < end) ? bt[idx] : 0;
    }
  };
  auto load_tile = [&](int ti, const int* pages, int stage) {
    __nv_bfloat16* dst = skv + stage * BLOCK_N * ROW;
    const int n0 = start + ti * BLOCK_N, first = n0 >> page_shift;
    if (BULK) {  // warp 0: a lane per token row
      if (warp != 0) return;
      const uint32_t bar = smem_u32(&bars[stage]);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stage was read by ldmatrix
      if (lane == 0) mbar_expect(bar, (uint32_t)min(BLOCK_N, end - n0) * (D * 2));
      __syncwarp();
#pragma unroll
      for (int n = lane; n < BLOCK_N; n += 32) {
        int pos = n0 + n;
        int slot = (pos >> page_shift) - first;
        int pg = pages[0];
#pragma unroll
        for (int p = 1; p < MAXP; ++p) pg = slot == p ? pages[p] : pg;
        if (pos < end) {
          const __nv_bfloat16* src =
              kv + (int64_t)pg * stride_kv_page + (int64_t)(pos & ((1 << page_shift) - 1)) * stride_kv_tok;
          bulk_copy(smem_u32(dst + n * ROW), src, D * 2, bar);
        } else {  // past the split: zeros (p = 0 must not meet stale NaNs)
          for (int c = 0; c < D; c += 8) *reinterpret_cast<int4*>(dst + n * ROW + c) = make_int4(0, 0, 0, 0);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
      int c = tid + i * THREADS;
      int n = c / (D / 8), col = (c % (D / 8)) * 8;
      int pos = n0 + n;
      bool ok = ti < tiles && pos < end;
      int slot = (pos >> page_shift) - first;
      int pg = pages[0];
#pragma unroll
      for (int p = 1; p < MAXP; ++p) pg = slot == p ? pages[p] : pg;
      const __nv_bfloat16* src =
          kv + (int64_t)pg * stride_kv_page + (int64_t)(pos & ((1 << page_shift) - 1)) * stride_kv_tok + col;
      cp_async16(smem_u32(dst + n * ROW + col), ok ? src : kv, ok);
    }
  };
  int pages[MAXP];
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    fetch_pages(s, pages);
    if (s < tiles) load_tile(s, pages, s);
    cp_commit();  // the Q loads ride in group 0
  }
  fetch_pages(STAGES - 1, pages);  // consumed by the first iteration

  // causal limit of this lane's two rows (g, g + 8)
  int row_seq[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int r = g + 8 * h;
    int tok = r < rows ? r / num_heads : 0;
    row_seq[h] = r < rows ? seq - (q_len - 1 - tok) : 0;
  }

  uint32_t qa[KSTEPS_QK][4];
  float acc[NT_PV][4];
#pragma unroll
  for (int j = 0; j < NT_PV; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_i[2] = {NEG_BIG, NEG_BIG}, l_i[2] = {0.f, 0.f};

  const int mat = lane >> 3, mr = lane & 7;
  for (int it = 0; it < tiles; ++it) {
    if (BULK) {
      if (it == 0) cp_wait<0>();  // Q
      mbar_wait(smem_u32(&bars[it % STAGES]), (it / STAGES) & 1);
    } else {
      cp_wait<STAGES - 2>();
    }
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int k = 0; k < KSTEPS_QK; ++k) {
        int col = warp * (D / WARPS) + k * 16 + (mat >> 1) * 8;
        ldsm_x4(smem_u32(sq + (mr + (mat & 1) * 8) * ROW + col), qa[k][0], qa[k][1], qa[k][2], qa[k][3]);
      }
    }
    {
      int nxt = it + STAGES - 1;
      if (nxt < tiles) load_tile(nxt, pages, nxt % STAGES);
      cp_commit();
      fetch_pages(nxt + 1, pages);
    }
    const __nv_bfloat16* tile = skv + (it % STAGES) * BLOCK_N * ROW;

    if (LOAD_ONLY) {  // timing probe: the tile pipeline alone
      if (tid == 0 && tile[0] == __float2bfloat16(12345.f)) ws_lse[0] = 1.f;
      continue;
    }
    // partial scores over this warp's 144 dims, all BLOCK_N tokens
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int k = 0; k < KSTEPS_QK; ++k) {
      int col = warp * (D / WARPS) + k * 16 + (mat & 1) * 8;
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_u32(tile + (j * 8 + mr + (mat >> 1) * 8) * ROW + col), b0, b1, b2, b3);
        mma(s[j], qa[k], b0, b1);
        mma(s[j + 1], qa[k], b2, b3);
      }
    }
    float4* mine = reinterpret_cast<float4*>(ss) + warp * NT * 32 + lane;
#pragma unroll
    for (int j = 0; j < NT; ++j) mine[j * 32] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
    __syncthreads();
    // every warp sums the four partials in the same order: identical scores in each warp
    float tot[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) tot[j][0] = tot[j][1] = tot[j][2] = tot[j][3] = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float4* part = reinterpret_cast<const float4*>(ss) + w * NT * 32 + lane;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float4 v = part[j * 32];
        tot[j][0] += v.x; tot[j][1] += v.y; tot[j][2] += v.z; tot[j][3] += v.w;
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = tot[j][0], s[j][1] = tot[j][1], s[j][2] = tot[j][2], s[j][3] = tot[j][3];

    // online softmax (log2 domain) for rows g and g + 8
    const int n0 = start + it * BLOCK_N;
    float mx[2] = {m_i[0], m_i[1]};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int h = e >> 1;
        int pos = n0 + j * 8 + 2 * t4 + (e & 1);
        bool vis = pos < end && pos < row_seq[h];
        float v = vis ? s[j][e] * scale_log2 : -INFINITY;
        s[j][e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
    }
    float alpha[2] = {exp2f(m_i[0] - mx[0]), exp2f(m_i[1] - mx[1])};
    uint32_t pa[KP][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float p0 = exp2f(s[j][0] - mx[0]), p1 = exp2f(s[j][1] - mx[0]);
      float p2 = exp2f(s[j][2] - mx[1]), p3 = exp2f(s[j][3] - mx[1]);
      l_i[0] = (j == 0 ? l_i[0] * alpha[0] : l_i[0]) + p0 + p1;
      l_i[1] = (j == 0 ? l_i[1] * alpha[1] : l_i[1]) + p2 + p3;
      pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(p0, p1);
      pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    m_i[0] = mx[0];
    m_i[1] = mx[1];
#pragma unroll
    for (int j = 0; j < NT_PV; ++j) {
      acc[j][0] *= alpha[0]; acc[j][1] *= alpha[0];
      acc[j][2] *= alpha[1]; acc[j][3] *= alpha[1];
    }
    // P . V over this warp's 128 output dims (V = the tile's first 512 columns)
#pragma unroll
    for (int kp = 0; kp < KP; ++kp) {
#pragma unroll
      for (int j = 0; j < NT_PV; j += 2) {
        uint32_t b0, b1, b2, b3;
        int tok = kp * 16 + mr + (mat & 1) * 8;
        int col = warp * (DV / WARPS) + j * 8 + (mat >> 1) * 8;
        ldsm_x4_t(smem_u32(tile + tok * ROW + col), b0, b1, b2, b3);
        mma(acc[j], pa[kp], b0, b1);
        mma(acc[j + 1], pa[kp], b2, b3);
      }
    }
  }
  cp_wait<0>();

  // normalise, write the partials: workspace row = (request rows) * splits + split
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_i[h] += __shfl_xor_sync(0xffffffff, l_i[h], 1);
    l_i[h] += __shfl_xor_sync(0xffffffff, l_i[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int r = g + 8 * h;
    if (r >= rows) continue;
    bool has = l_i[h] > 0.f;
    float inv = has ? 1.f / l_i[h] : 0.f;
    int64_t ws = ((int64_t)req * rows + r) * num_splits + split;
    float* o = ws_out + ws * DV + warp * (DV / WARPS) + 2 * t4;
#pragma unroll
    for (int j = 0; j < NT_PV; ++j)
      *reinterpret_cast<float2*>(o + j * 8) = make_float2(acc[j][2 * h] * inv, acc[j][2 * h + 1] * inv);
    if (warp == 0 && t4 == 0) ws_lse[ws] = has ? (m_i[h] + log2f(l_i[h])) * 0.6931471805599453f : -INFINITY;
  }
}

#ifdef KERNEL_ONLY
template __global__ void mla_split_kernel<32, 2>(const __nv_bfloat16*, const __nv_bfloat16*, const int*, const int*,
    float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
template __global__ void mla_split_kernel<32, 3>(const __nv_bfloat16*, const __nv_bfloat16*, const int*, const int*,
    float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
template __global__ void mla_split_kernel<64, 2>(const __nv_bfloat16*, const __nv_bfloat16*, const int*, const int*,
    float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
template __global__ void mla_split_kernel<32, 3, true>(const __nv_bfloat16*, const __nv_bfloat16*, const int*, const int*,
    float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
template __global__ void mla_split_kernel<32, 3, false, true>(const __nv_bfloat16*, const __nv_bfloat16*,
    const int*, const int*, float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
template __global__ void mla_split_kernel<16, 4>(const __nv_bfloat16*, const __nv_bfloat16*, const int*, const int*,
    float*, float*, float, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int);
}  // namespace
#else
template <int BLOCK_N, int STAGES, bool LOAD_ONLY = false, bool BULK = false>
void launch(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& bt, const torch::Tensor& sl,
            torch::Tensor& ws_out, torch::Tensor& ws_lse, double scale_log2, int q_len, int num_splits) {
  const int batch = bt.size(0), heads = q.size(1);
  size_t smem = (size_t)(ROWS + STAGES * BLOCK_N) * ROW * 2 + WARPS * 32 * (BLOCK_N / 8) * 4 * 4;
  auto kern = mla_split_kernel<BLOCK_N, STAGES, LOAD_ONLY, BULK>;
  static bool attr = false;  // once per instantiation
  if (!attr) {
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attr = true;
  }
  dim3 grid(num_splits, batch);
  kern<<<grid, THREADS, smem, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(q.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(kv.data_ptr()),
      bt.data_ptr<int>(), sl.data_ptr<int>(), ws_out.data_ptr<float>(), ws_lse.data_ptr<float>(), (float)scale_log2,
      q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), bt.stride(0), heads, q_len, num_splits,
      __builtin_ctz((unsigned)kv.size(1)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void mla_split(torch::Tensor q, torch::Tensor kv, torch::Tensor bt, torch::Tensor sl, torch::Tensor ws_out,
               torch::Tensor ws_lse, double scale_log2, int64_t q_len, int64_t num_splits, int64_t block_n,
               int64_t stages, bool bulk) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16, "bf16 q and KV only");
  TORCH_CHECK(q.size(1) * q_len <= ROWS, "q_len x heads must be <= 16");
  TORCH_CHECK((kv.size(1) & (kv.size(1) - 1)) == 0 && kv.size(1) >= 16, "page size: a power of two >= 16");
  TORCH_CHECK(q.stride(2) == 1 && kv.stride(2) == 1 && kv.size(2) == D, "last dims contiguous, 576 wide");
  TORCH_CHECK(q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && kv.stride(0) % 8 == 0 && kv.stride(1) % 8 == 0,
              "16-byte aligned rows");
#define K2_CASE(BN, ST)                                                                          \
  if (block_n == BN && stages == ST && !bulk)                                                    \
    return launch<BN, ST>(q, kv, bt, sl, ws_out, ws_lse, scale_log2, q_len, num_splits);         \
  if (block_n == BN && stages == -ST && !bulk) /* load-only timing probe */                      \
    return launch<BN, ST, true>(q, kv, bt, sl, ws_out, ws_lse, scale_log2, q_len, num_splits);   \
  if (block_n == BN && stages == ST && bulk)                                                     \
    return launch<BN, ST, false, true>(q, kv, bt, sl, ws_out, ws_lse, scale_log2, q_len, num_splits); \
  if (block_n == BN && stages == -ST && bulk)                                                    \
    return launch<BN, ST, true, true>(q, kv, bt, sl, ws_out, ws_lse, scale_log2, q_len, num_splits);
  K2_CASE(32, 2) K2_CASE(32, 3) K2_CASE(32, 4) K2_CASE(16, 4) K2_CASE(16, 8)
#undef K2_CASE
  TORCH_CHECK(false, "no instantiation for block_n ", block_n, " stages ", stages, " bulk ", bulk);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("mla_split", &mla_split, "MLA decode split partials (probe)"); }
#endif
