// The CUDA forward pass's kernels. Plain and readable first: one thread per element for the
// elementwise stages, one block per row for norms, one warp per weight row for GEMV (the decode
// bottleneck, where the whole weight must stream from HBM once per token), and blocks per
// (query, head) for attention with the columns split over their warps (online softmax).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/device_kernels.cuh"

namespace dki {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n, int threads = kThreads) { return unsigned((n + threads - 1) / threads); }

// The sum (or max) over each group of kLanes consecutive lanes (a power of two up to 32), in every
// lane of the group; by default the whole warp.
template <int kLanes = 32>
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int kLanes = 32>
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kLanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float q8_element(const unsigned char* row, int i) {
  const unsigned char* block = row + (i / kQ8Block) * kQ8BlockBytes;
  const __half d = *reinterpret_cast<const __half*>(block);  // 2-byte aligned: blocks are 34 bytes
  return __half2float(d) * float(static_cast<signed char>(block[2 + i % kQ8Block]));
}

__device__ __forceinline__ float load_element(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return 0.f;  // Q8_0 rows are read with q8_element
  }
}

__global__ void embed_kernel(const void* E, DType dt, int D, const int32_t* tokens, int T, float* x) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * D) return;
  const int t = int(i / D), c = int(i % D);
  const size_t row = size_t(tokens[t]);
  x[i] = dt == DType::Q8_0 ? q8_element(static_cast<const unsigned char*>(E) + row * (D / kQ8Block) * kQ8BlockBytes, c)
                           : load_element(E, dt, row * D + c);
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int D, float* out) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + size_t(blockIdx.x) * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    ss = warp_sum(ss);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / D + eps);
  float* o = out + size_t(blockIdx.x) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

__global__ void add_bias_kernel(float* y, const float* b, int T, int n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(T) * n) y[i] += b[i % n];
}

// Rotary pair p of a head: rotate-half pairs (p, p + hd/2), interleaved pairs (2p, 2p + 1).
struct RotaryPair {
  int a, b;
  __device__ RotaryPair(int p, int half, bool interleaved) : a(interleaved ? 2 * p : p), b(interleaved ? 2 * p + 1 : p + half) {}
  // dst's pair = src's pair rotated by the angle with cosine c and sine s (dst may be src).
  __device__ __forceinline__ void rotate(const float* src, float* dst, float c, float s) const {
    const float xa = src[a], xb = src[b];
    dst[a] = xa * c - xb * s;
    dst[b] = xb * c + xa * s;
  }
};

// One thread per rotary pair.
__global__ void rope_kernel(float* x, int T, int n_heads, int hd, const float* cos, const float* sin, bool interleaved) {
  const int half = hd / 2;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * n_heads * half) return;
  const int p = int(i % half);
  const size_t th = i / half;  // t * n_heads + h
  const int t = int(th / n_heads);
  float* v = x + th * hd;
  RotaryPair(p, half, interleaved).rotate(v, v, cos[size_t(t) * half + p], sin[size_t(t) * half + p]);
}

// Block column y takes blocks y, y + gridDim.y, ... of the table; its threads walk the rotary
// pairs of every (row, token) of the block.
__global__ void place_segments_kernel(const SegmentPlacement* table, int n, size_t rows, int S, int hd, const float* turns, bool interleaved,
                                      float* seg_k, float* seg_v) {
  const int half = hd / 2;
  for (int b = blockIdx.y; b < n; b += gridDim.y) {
    const SegmentPlacement c = table[b];
    const size_t pairs = rows * c.n_tokens * half;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += size_t(gridDim.x) * blockDim.x) {
      const int p = int(i % half);
      const size_t rt = i / half, r = rt / c.n_tokens, t = rt % c.n_tokens;
      const float *k = c.k + r * c.pitch + t * hd, *v = c.v + r * c.pitch + t * hd;
      float *to_k = seg_k + (r * S + c.off + t) * hd, *to_v = seg_v + (r * S + c.off + t) * hd;
      const RotaryPair pair(p, half, interleaved);
      if (c.turn >= 0) {
        pair.rotate(k, to_k, turns[size_t(c.turn) * hd + p], turns[size_t(c.turn) * hd + half + p]);
      } else {
        to_k[pair.a] = k[pair.a];
        to_k[pair.b] = k[pair.b];
      }
      if (v != to_v) to_v[pair.a] = v[pair.a], to_v[pair.b] = v[pair.b];
    }
  }
}

// Rotates the chunk's queries [T, H, hd] in place and its keys [T, Hkv, hd] into this layer's cache
// at rows n_past + t, with the values beside them: one thread per rotary pair of a q or k head.
__global__ void rope_store_kernel(RopeStoreArgs a) {
  const int half = a.hd / 2, heads = a.H + a.Hkv;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(a.T) * heads * half) return;
  const int p = int(i % half);
  const int h = int((i / half) % heads);
  const int t = int(i / (size_t(half) * heads));
  const RotaryPair pair(p, half, a.interleaved);
  const float c = a.cos[size_t(t) * half + p], s = a.sin[size_t(t) * half + p];
  if (h < a.H) {
    float* q = a.q + (size_t(t) * a.H + h) * a.hd;
    pair.rotate(q, q, c, s);
    return;
  }
  const int kh = h - a.H;
  const size_t src = (size_t(t) * a.Hkv + kh) * a.hd;
  const size_t dst = (size_t(kh) * a.max_tokens + *a.n_past + t) * a.hd;
  pair.rotate(a.k + src, a.k_cache + dst, c, s);
  a.v_cache[dst + pair.a] = a.v[src + pair.a];
  a.v_cache[dst + pair.b] = a.v[src + pair.b];
}

__global__ void swiglu_kernel(float* gate, const float* up, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  gate[i] = g / (1.f + expf(-g)) * up[i];
}

__global__ void scale_kernel(float* x, float a, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

// Largest |x[i]|, as float bits: for non-negative floats the unsigned order is the float order,
// with NaN above inf, so a NaN input is seen (fmaxf would drop it).
__global__ void absmax_bits_kernel(const float* x, size_t n, unsigned* bits) {
  unsigned m = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(bits, m);
}

// F16 ends at 65504 and activations do not (outlier features reach 1e4–1e5 in some models, and
// would become inf): the power of two s that brings max|x|·s below 2^15, where rounding cannot
// reach the end. 1 when max|x| is there already, or not finite (inf and NaN then reach the
// logits as they do in fp32). A power of two scales exactly, and the GEMM's alpha undoes it; but
// s is one for the whole chunk, so one outlier also moves every other element (and the lo
// halves) toward F16's subnormals, where they keep fewer bits: ~2 bits less per factor of 4
// beyond 2^15 for values below 2^-14·(1/s).
__device__ float f16_prescale(float absmax) {
  if (!(absmax >= 32768.f) || isinf(absmax)) return 1.f;
  int e = 0;
  frexpf(absmax, &e);  // absmax < 2^e
  return ldexpf(1.f, 15 - e);
}

// x·s = hi + lo in a half type: a GEMM of each against half-precision weights, summed, sees the
// activations to ~16 significant bits (a single rounding to BF16 keeps 8), as the CPU's fp32 does.
// s = f16_prescale(max|x|) for F16; BF16 has fp32's range, s = 1. sc->alpha = 1/s.
template <class Half>
__global__ void split_half_kernel(const float* x, size_t n, GemmScalars* sc, Half* hi, Half* lo) {
  constexpr bool kF16 = std::is_same<Half, __half>::value;
  const float s = kF16 ? f16_prescale(__uint_as_float(sc->absmax_bits)) : 1.f;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) sc->alpha = 1.f / s;
  if (i >= n) return;
  const float v = x[i] * s;
  if constexpr (kF16) {
    const __half h = __float2half_rn(v);
    hi[i] = h, lo[i] = __float2half_rn(v - __half2float(h));
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h, lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

__global__ void dequant_q8_kernel(const unsigned char* q8, size_t n, __half* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned char* block = q8 + (i / kQ8Block) * kQ8BlockBytes;
  out[i] = __float2half_rn(__half2float(*reinterpret_cast<const __half*>(block)) * float(static_cast<signed char>(block[2 + i % kQ8Block])));
}

// --- GEMV: T ≤ kGemvMaxTokens tokens at once ----------------------------------------------
//
// Decode is bound by streaming the weights from HBM once per token. Each output ("unit") needs
// Mats weight rows: one for a plain projection; the gate and up rows of the MLP; the two rows of
// a rotary pair of q, k or v. A warp takes one row, with kLoads 16-byte loads a lane in flight
// (one load at a time leaves most of the bandwidth unused); a unit's two rows are two warps of
// one block, whose sums meet in shared memory. Weight loads are streaming (evict-first: each
// weight is read once); the input rows, read by every warp, stay cached.
//
// Tried on an H200 and given up, none faster per 1B decode step than this kernel in the same run
// (bench/results/gpu-gemv-experiments.md): long rows cut over up to 8 warps of a block (7-14%),
// 8 loads a lane (12%), loads that skip L1 (no change), launches as programmatic dependents that
// prefetch their rows into L2 (2%), and a persistent grid whose warps keep 8 loads in flight
// across rows and units (27%). ncu puts this kernel and the persistent one at 25-37% of DRAM
// peak on the 1B projections, with 24-47% of warps active.

constexpr int kGemvWarps = kThreads / 32;
constexpr int kLoads = 4;
constexpr int kChunkCols = 32 * 8;  // columns one 16-byte load of every lane covers (half weights)

// 8 half-precision weights from one 16-byte load, as fp32.
template <class Half>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&w)[8]) {
  const Half* h = reinterpret_cast<const Half*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; j++) {
    if constexpr (std::is_same<Half, __half>::value) w[j] = __half2float(h[j]);
    else w[j] = __bfloat162float(h[j]);
  }
}

// acc[t] += the 8 weights of `raw` (columns c..c+7) · x[t, c..c+7], with the norm gains g folded
// in when g is set; ss[t] += Σ x[t, c..c+7]² when ss is set.
template <class Half, int T>
__device__ __forceinline__ void dot8(const uint4& raw, int c, const float* x, int cols, const float* g, float (&acc)[T], float* ss) {
  float w[8];
  unpack8<Half>(raw, w);
  if (g) {
    const float4 g0 = __ldg(reinterpret_cast<const float4*>(g + c)), g1 = __ldg(reinterpret_cast<const float4*>(g + c + 4));
    w[0] *= g0.x, w[1] *= g0.y, w[2] *= g0.z, w[3] *= g0.w, w[4] *= g1.x, w[5] *= g1.y, w[6] *= g1.z, w[7] *= g1.w;
  }
#pragma unroll
  for (int t = 0; t < T; t++) {
    const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * cols + c));
    const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * cols + c + 4));
    acc[t] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y + w[6] * x1.z + w[7] * x1.w;
    if (ss) ss[t] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w + x1.x * x1.x + x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
  }
}

// F16 / BF16 rows whose length is a multiple of 8 (so every row starts 16-byte aligned).
template <class Half, int T>
__device__ __forceinline__ void dot_half(const Half* wr, int cols, const float* x, const float* g, int lane, float (&acc)[T], float* ss) {
  for (int c0 = lane * 8; c0 < cols; c0 += kChunkCols * kLoads) {
    uint4 raw[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; u++)
      raw[u] = c0 + u * kChunkCols < cols ? __ldcs(reinterpret_cast<const uint4*>(wr + c0 + u * kChunkCols)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kLoads; u++)
      if (c0 + u * kChunkCols < cols) dot8<Half, T>(raw[u], c0 + u * kChunkCols, x, cols, g, acc, ss);
  }
}

// Q8_0 rows: each lane takes whole 32-weight blocks (scale once, then 32 int8 products).
template <int T>
__device__ __forceinline__ void dot_q8(const unsigned char* wr, int cols, const float* x, const float* g, int lane, float (&acc)[T], float* ss) {
  for (int b = lane; b < cols / kQ8Block; b += 32) {
    const unsigned char* block = wr + size_t(b) * kQ8BlockBytes;
    const float d = __half2float(*reinterpret_cast<const __half*>(block));
    const signed char* q = reinterpret_cast<const signed char*>(block + 2);
#pragma unroll
    for (int t = 0; t < T; t++) {
      const float* xb = x + size_t(t) * cols + size_t(b) * kQ8Block;
      float s = 0.f, sq = 0.f;
#pragma unroll
      for (int j = 0; j < kQ8Block; j++) {
        s += float(q[j]) * xb[j] * (g ? g[size_t(b) * kQ8Block + j] : 1.f);
        if (ss) sq += xb[j] * xb[j];
      }
      acc[t] += d * s;
      if (ss) ss[t] += sq;
    }
  }
}

// Row r of W (any dtype) with the T input rows, summed over the warp: every lane gets the sums.
// ss, when not null, receives Σ x[t]² in ss[t], for a folded RMSNorm: the warp reads every column
// of x once anyway, so the norm costs no pass of its own over the input.
template <int T>
__device__ __forceinline__ void row_dot(const DeviceMatrix& W, int r, const float* x, const float* g, int lane, float (&acc)[T], float* ss) {
#pragma unroll
  for (int t = 0; t < T; t++) {
    acc[t] = 0.f;
    if (ss) ss[t] = 0.f;
  }
  const size_t off = size_t(r) * W.cols;
  const bool vec8 = W.cols % 8 == 0;
  if (W.dtype == DType::BF16 && vec8) {
    dot_half<__nv_bfloat16, T>(static_cast<const __nv_bfloat16*>(W.data) + off, W.cols, x, g, lane, acc, ss);
  } else if (W.dtype == DType::F16 && vec8) {
    dot_half<__half, T>(static_cast<const __half*>(W.data) + off, W.cols, x, g, lane, acc, ss);
  } else if (W.dtype == DType::Q8_0) {
    dot_q8<T>(static_cast<const unsigned char*>(W.data) + size_t(r) * (W.cols / kQ8Block) * kQ8BlockBytes, W.cols, x, g, lane, acc, ss);
  } else {
    for (int c = lane; c < W.cols; c += 32) {
      const float w = load_element(W.data, W.dtype, off + c) * (g ? g[c] : 1.f);
#pragma unroll
      for (int t = 0; t < T; t++) {
        const float xv = x[size_t(t) * W.cols + c];
        acc[t] += w * xv;
        if (ss) ss[t] += xv * xv;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; t++) {
    acc[t] = warp_sum(acc[t]);
    if (ss) ss[t] = warp_sum(ss[t]);
  }
}

// What a unit's sums become: a plain projection's rows, the MLP's gate, or rotated q and k with v.
enum class GemvOut { Plain, Swiglu, QkvRope };
template <GemvOut Out>
constexpr int kMatsOf = Out == GemvOut::Plain ? 1 : 2;

// The rows of unit u: of part p (-1 past the last unit), row[m] for each of its rows, and for a
// rotary pair its head and pair index within the head.
struct GemvUnit {
  int p = -1;
  int row[2] = {0, 0};
  int head = 0, pair = 0;
};

template <GemvOut Out>
__device__ __forceinline__ GemvUnit gemv_unit(const GemvBatch& b, int u) {
  GemvUnit U;
  if constexpr (Out == GemvOut::Swiglu) {
    if (u < b.part[0].W.rows) U.p = 0, U.row[0] = U.row[1] = u;
    return U;
  }
  // The parts' units laid end to end (q, then k, then v).
  constexpr int kRowsEach = Out == GemvOut::QkvRope ? 2 : 1;
  int p = 0;
  while (p < b.n_parts && u >= b.part[p].W.rows / kRowsEach) u -= b.part[p++].W.rows / kRowsEach;
  if (p == b.n_parts) return U;
  U.p = p;
  if constexpr (Out == GemvOut::Plain) {
    U.row[0] = u;
  } else {
    const int hd = b.rope.hd, half = hd / 2;
    U.head = u / half, U.pair = u % half;
    const RotaryPair rp(U.pair, half, b.rope.interleaved);
    U.row[0] = U.head * hd + rp.a, U.row[1] = U.head * hd + rp.b;
  }
  return U;
}

// The matrix of row m of unit U (the gate and the up projection are parts 0 and 1).
template <GemvOut Out>
__device__ __forceinline__ const DeviceMatrix& unit_matrix(const GemvBatch& b, const GemvUnit& U, int m) {
  return b.part[Out == GemvOut::Swiglu ? m : U.p].W;
}

// Writes unit U's outputs from its row sums (sum[m][t]) and, with a folded norm, the sums of
// squares of the input rows (sq[t]).
template <GemvOut Out, int T>
__device__ __forceinline__ void gemv_store(const GemvBatch& b, const GemvUnit& U, const float (&sum)[kMatsOf<Out>][T], const float (&sq)[T]) {
  const GemvPart& P = b.part[U.p];
  const int n = P.W.rows;
#pragma unroll
  for (int t = 0; t < T; t++) {
    const float inv = b.norm ? rsqrtf(sq[t] / b.cols + b.eps) : 1.f;  // 1 / rms of input row t
    if constexpr (Out == GemvOut::Plain) {
      float& y = P.y[size_t(t) * n + U.row[0]];
      y = (b.accumulate ? y : 0.f) + sum[0][t] * inv + (P.bias ? P.bias[U.row[0]] : 0.f);
    } else if constexpr (Out == GemvOut::Swiglu) {
      const float g = sum[0][t] * inv;
      P.y[size_t(t) * n + U.row[0]] = g / (1.f + expf(-g)) * sum[1][t] * inv;
    } else {
      const RopeStoreArgs& r = b.rope;
      const float xa = sum[0][t] * inv + (P.bias ? P.bias[U.row[0]] : 0.f);
      const float xb = sum[1][t] * inv + (P.bias ? P.bias[U.row[1]] : 0.f);
      const float c = r.cos[size_t(t) * (r.hd / 2) + U.pair], s = r.sin[size_t(t) * (r.hd / 2) + U.pair];
      const float ra = U.p == 2 ? xa : xa * c - xb * s, rb = U.p == 2 ? xb : xb * c + xa * s;  // v is not rotated
      if (U.p == 0) {
        P.y[size_t(t) * n + U.row[0]] = ra, P.y[size_t(t) * n + U.row[1]] = rb;
      } else {
        const int in_head = U.head * r.hd;
        float* dst = (U.p == 1 ? r.k_cache : r.v_cache) + (size_t(U.head) * r.max_tokens + *r.n_past + t) * r.hd;
        dst[U.row[0] - in_head] = ra, dst[U.row[1] - in_head] = rb;
      }
    }
  }
}

// Warp w of the grid takes row w % Mats of unit w / Mats.
template <int T, GemvOut Out>
__global__ void gemv_kernel(GemvBatch b) {
  constexpr int kMats = kMatsOf<Out>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, m = warp % kMats;
  const GemvUnit U = gemv_unit<Out>(b, int((size_t(blockIdx.x) * kGemvWarps + warp) / kMats));
  const bool live = U.p >= 0;
  // The input's squares from the first row's warp only: it reads every column once.
  const bool squares = b.norm && m == 0;
  float acc[T] = {}, ss[T] = {};
  if (live) row_dot<T>(unit_matrix<Out>(b, U, m), U.row[m], b.x, b.norm, lane, acc, squares ? ss : nullptr);
  float sum[kMats][T];
  if constexpr (kMats == 1) {
    if (!live || lane != 0) return;
#pragma unroll
    for (int t = 0; t < T; t++) sum[0][t] = acc[t];
  } else {
    __shared__ float s_acc[kGemvWarps][T];
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < T; t++) s_acc[warp][t] = acc[t];
    }
    __syncthreads();  // every warp of the block gets here
    if (!live || m != 0 || lane != 0) return;
#pragma unroll
    for (int t = 0; t < T; t++) sum[0][t] = acc[t], sum[1][t] = s_acc[warp + 1][t];
  }
  gemv_store<Out, T>(b, U, sum, ss);
}

// --- Attention ----------------------------------------------------------------------------
//
// Two kernels over the same columns [segments ; own tokens], both built from OnlineSoftmax:
//  - prefill (T > kGemvMaxTokens): flash-style tiling. A block takes kQueryTile queries of one
//    head and walks the columns in tiles of kColTile that all its warps read from shared memory,
//    so each K/V row leaves global memory once per query tile instead of once per query.
//  - decode (a few queries): split-K. A block takes one (query, head) and one of `splits` column
//    ranges, so the whole GPU streams the cache; a second kernel merges the partial states.

constexpr int kAttnWarps = 8;
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int kQueryTile = 32;                          // queries per prefill block
constexpr int kQueriesPerWarp = kQueryTile / kAttnWarps;
constexpr int kColTile = 16;                            // columns per shared-memory tile

// Column j of head kvh: its key and value rows, score bias and value scale.
struct Column {
  const float *k, *v;
  float bias, vscale;
};
__device__ __forceinline__ Column column(const AttentionArgs& a, int kvh, int j) {
  if (j < a.S_seg) {
    const size_t r = size_t(kvh) * a.S_seg + j;
    return {a.seg_k + r * a.hd, a.seg_v + r * a.hd, a.seg_bias[j], a.seg_vscale[j]};
  }
  const size_t r = size_t(kvh) * a.max_tokens + (j - a.S_seg);
  return {a.k_cache + r * a.hd, a.v_cache + r * a.hd, 0.f, 1.f};
}

// One query's softmax over columns seen one at a time, held by a warp: running max m, Σ e^{s−m},
// Σ e^{s−m}·s (for the entropy) and Σ e^{s−m}·α·v. Lane i holds head dimensions i, i + 32, ...
struct OnlineSoftmax {
  float m = -INFINITY, l = 0.f, es = 0.f;
  float acc[kPerLane] = {};

  // Takes column score s (bias included) with value row v (global or shared memory).
  __device__ __forceinline__ void update(float s, const float* v, float vscale, int hd, int lane) {
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first column (m = −∞)
    const float p = expf(s - m_new);
    l = l * corr + p;
    es = es * corr + p * s;
    const float pv = p * vscale;
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < hd ? pv * v[d] : 0.f);
    }
    m = m_new;
  }

  // k and v may be in global or shared memory.
  __device__ __forceinline__ void add(const float (&q)[kPerLane], const float* k, const float* v, float bias, float vscale, float scale,
                                      int hd, int lane) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int d = lane + 32 * i;
      if (d < hd) dot += q[i] * k[d];
    }
    update(warp_sum(dot) * scale + bias, v, vscale, hd, lane);
  }
};

__device__ __forceinline__ void load_query(const AttentionArgs& a, int t, int h, int lane, float (&q)[kPerLane]) {
  const float* qp = a.q + (size_t(t) * a.H + h) * a.hd;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    q[i] = d < a.hd ? qp[d] : 0.f;
  }
}

// H = −Σ p·ln p with p = e^{s−M}/L  =  M + ln L − (Σ e^{s−M}·s)/L
__device__ __forceinline__ float entropy_of(float M, float L, float ES) { return M + logf(L) - ES / L; }

// Block (query tile, h). Warp w owns queries tile·kQueryTile + w + kAttnWarps·i, so a warp's
// queries spread over the tile and the causal work stays balanced between warps.
__global__ void attention_prefill_kernel(AttentionArgs a) {
  const int h = blockIdx.y, kvh = h / (a.H / a.Hkv), hd = a.hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t0 = blockIdx.x * kQueryTile;
  const int t_last = min(a.T, t0 + kQueryTile) - 1;
  const int base = a.S_seg + *a.n_past;  // query t sees columns [0, base + t]

  __shared__ float sk[kColTile][kMaxHeadDim], sv[kColTile][kMaxHeadDim];
  __shared__ float s_bias[kColTile], s_vscale[kColTile];

  float q[kQueriesPerWarp][kPerLane];
  OnlineSoftmax st[kQueriesPerWarp];
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; i++) {
    const int t = t0 + warp + kAttnWarps * i;
    if (t < a.T) load_query(a, t, h, lane, q[i]);
  }

  const int S = base + t_last + 1;  // the columns the tile's last query sees
  for (int c0 = 0; c0 < S; c0 += kColTile) {
    const int n = min(kColTile, S - c0);
    __syncthreads();  // the previous tile has been read by every warp
    for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
      const int j = e / hd, d = e % hd;
      const Column col = column(a, kvh, c0 + j);
      sk[j][d] = col.k[d];
      sv[j][d] = col.v[d];
      if (d == 0) s_bias[j] = col.bias, s_vscale[j] = col.vscale;
    }
    __syncthreads();
    // Column by column for all the warp's queries at once: their dot products and warp sums
    // are independent, so they interleave instead of waiting on each other's shuffles.
    for (int j = 0; j < n; j++) {
      float dot[kQueriesPerWarp];
#pragma unroll
      for (int i = 0; i < kQueriesPerWarp; i++) {
        dot[i] = 0.f;
#pragma unroll
        for (int r = 0; r < kPerLane; r++) {
          const int d = lane + 32 * r;
          if (d < hd) dot[i] += q[i][r] * sk[j][d];
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < kQueriesPerWarp; i++) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], o);
#pragma unroll
      for (int i = 0; i < kQueriesPerWarp; i++) {
        const int t = t0 + warp + kAttnWarps * i;
        if (t < a.T && c0 + j <= base + t)  // causal
          st[i].update(dot[i] * a.scale + s_bias[j], sv[j], s_vscale[j], hd, lane);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; i++) {
    const int t = t0 + warp + kAttnWarps * i;
    if (t >= a.T) continue;
    float* op = a.out + (size_t(t) * a.H + h) * hd;
#pragma unroll
    for (int r = 0; r < kPerLane; r++) {
      const int d = lane + 32 * r;
      if (d < hd) op[d] = st[i].acc[r] / st[i].l;
    }
    if (a.entropy && t == a.T - 1 && lane == 0) a.entropy[h] = entropy_of(st[i].m, st[i].l, st[i].es);
  }
}

// Merges the splits' partial states of row (t, h) into its output row, as the warps of one block
// are merged in attention_split_kernel: run by the row's block that finishes last. The states
// were written by other blocks: read through L2 (__ldcg), not a stale L1.
__device__ void combine_splits(const AttentionArgs& a, int t, int h) {
  const int hd = a.hd;
  const size_t row = size_t(t) * a.H + h;
  const float* recs = a.partial + row * a.splits * (hd + 3);
  // Each split's weight e^{M_z − M} (0 for an empty split) once, so the loop over the splits
  // below is independent loads rather than a chain of branches on loaded values.
  __shared__ float weight[kDecodeSplits];
  __shared__ float sum_l, sum_es, max_m;
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int z = 0; z < a.splits; z++) M = fmaxf(M, __ldcg(recs + z * (hd + 3)));
    float L = 0.f, ES = 0.f;
    for (int z = 0; z < a.splits; z++) {
      const float* r = recs + z * (hd + 3);
      const float m = __ldcg(r);
      weight[z] = m == -INFINITY ? 0.f : expf(m - M);
      L += __ldcg(r + 1) * weight[z];
      ES += __ldcg(r + 2) * weight[z];
    }
    sum_l = L, sum_es = ES, max_m = M;
  }
  __syncthreads();
  float* op = a.out + row * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int z = 0; z < a.splits; z++) o += __ldcg(recs + z * (hd + 3) + 3 + d) * weight[z];
    op[d] = o / sum_l;
  }
  if (a.entropy && t == a.T - 1 && threadIdx.x == 0) a.entropy[h] = entropy_of(max_m, sum_l, sum_es);
}

// combine_splits for one row by one warp, so a block merges 8 rows at once: lanes take a split
// each for the weights (a.splits ≤ 32), then the row's dimensions.
__device__ void combine_splits_warp(const AttentionArgs& a, int t, int h, int lane) {
  const int hd = a.hd;
  const size_t row = size_t(t) * a.H + h;
  const float* recs = a.partial + row * a.splits * (hd + 3);
  const float* mine = recs + lane * (hd + 3);
  const bool split = lane < a.splits;
  const float m = split ? __ldcg(mine) : -INFINITY;
  const float M = warp_max(m);
  const float weight = m == -INFINITY ? 0.f : expf(m - M);  // 0 for an empty split and past a.splits
  const float L = warp_sum(split ? __ldcg(mine + 1) * weight : 0.f);
  const float ES = warp_sum(split ? __ldcg(mine + 2) * weight : 0.f);
  // Every lane takes each split's weight from its lane (the whole warp shuffles: with hd < 32
  // some lanes hold no dimension), then sums its dimensions.
  float o[kPerLane] = {};
  for (int z = 0; z < a.splits; z++) {
    const float wz = __shfl_sync(0xffffffffu, weight, z);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int d = lane + 32 * i;
      if (d < hd) o[i] += __ldcg(recs + z * (hd + 3) + 3 + d) * wz;
    }
  }
  float* op = a.out + row * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) op[d] = o[i] / L;
  }
  if (a.entropy && t == a.T - 1 && lane == 0) a.entropy[h] = entropy_of(M, L, ES);
}

// True in the block that counts last of the a.splits blocks sharing counter a.done[i]: it merges
// their states, with no second launch. Each thread makes its writes visible device-wide before
// the block counts itself; the count goes back to zero for the next launch once every split has
// counted.
__device__ bool finished_last(const AttentionArgs& a, size_t i) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(a.done + i, 1) == a.splits - 1;
    if (last) a.done[i] = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// --- Register-tiled prefill attention (the default; DKI_CUDA_ATTENTION=warp turns it off) ---
//
// The kernel above does one dot product per (query, column) across a warp and a shuffle tree to
// sum it: the GPU spends its time in shuffles, not FMAs. This one is FlashAttention's loop on
// CUDA cores, in fp32 throughout: a block of 256 threads takes kTileQ queries of one head and
// walks the columns in tiles of kTileC held in shared memory. Thread (ty, tx) of a 16 × 16 grid
// computes the 4 × 4 scores of queries ty·4.. against columns tx·4.. (two float4 reads from
// shared memory feed 16 FMAs), the 16 threads of a query row (one half-warp) agree on the
// row's running max and sums through shuffles, and the thread then adds P·V for its 4 queries at
// head dimensions tx·4 + 64·k. Head sizes up to kTileMaxHeadDim, multiples of 4.

constexpr int kTileQ = 64, kTileC = 64, kTileThreads = 256, kTileMaxHeadDim = 128;
constexpr int kTileDimGroups = kTileMaxHeadDim / 64;  // float4 output groups per thread and query
static_assert(kSplitMaxTokens <= kTileQ, "a split prefill is one tile of queries: its counters are one per head");
static_assert(kDecodeSplits <= 32, "combine_splits_warp gives each split a lane");

// Shared memory: Qᵀ [hd][kTileQ], Kᵀ [hd][kTileC], V [kTileC][hd], P [kTileQ][kTileC], and the
// tile's column biases and value scales.
size_t tiled_smem_bytes(int hd) { return sizeof(float) * (size_t(hd) * (kTileQ + 2 * kTileC) + kTileQ * kTileC + 2 * kTileC); }

// Stores 4 consecutive dimensions d.. of row r into a transposed [hd][ld] tile.
__device__ __forceinline__ void store_transposed(float* tile, int ld, int d, int r, float4 v) {
  tile[(d + 0) * ld + r] = v.x;
  tile[(d + 1) * ld + r] = v.y;
  tile[(d + 2) * ld + r] = v.z;
  tile[(d + 3) * ld + r] = v.w;
}

__global__ void __launch_bounds__(kTileThreads) attention_tiled_kernel(AttentionArgs a) {
  extern __shared__ float4 smem4[];
  const int hd = a.hd, hd4 = hd / 4;
  float* sQt = reinterpret_cast<float*>(smem4);
  float* sKt = sQt + hd * kTileQ;
  float* sV = sKt + hd * kTileC;
  float* sP = sV + kTileC * hd;
  float* s_bias = sP + kTileQ * kTileC;
  float* s_vscale = s_bias + kTileC;

  const int h = blockIdx.y, kvh = h / (a.H / a.Hkv);
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;  // a row group is one half-warp
  const int t0 = blockIdx.x * kTileQ;
  const int base = a.S_seg + *a.n_past;  // query t sees columns [0, base + t]
  const int t_last = min(a.T, t0 + kTileQ) - 1;

  // Consecutive threads take consecutive queries (conflict-free transposed stores).
  for (int e = tid; e < kTileQ * hd4; e += kTileThreads) {
    const int r = e % kTileQ, d = (e / kTileQ) * 4, t = t0 + r;
    const float4 v = t < a.T ? *reinterpret_cast<const float4*>(a.q + (size_t(t) * a.H + h) * hd + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    store_transposed(sQt, kTileQ, d, r, v);
  }

  float m[4], l[4], es[4], acc[4][kTileDimGroups][4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    m[i] = -INFINITY, l[i] = 0.f, es[i] = 0.f;
#pragma unroll
    for (int g = 0; g < kTileDimGroups; g++)
#pragma unroll
      for (int j = 0; j < 4; j++) acc[i][g][j] = 0.f;
  }

  // The columns the tile's last query sees, [0, S); split z of a.splits takes a range of whole
  // column tiles, [c_begin, c_end) (empty for the last splits of a short row).
  const int S = base + t_last + 1;
  // A warp holds queries 8w .. 8w + 7 of the tile: past the chunk's end (a short prompt's tile
  // is mostly empty) it only helps load the tiles.
  const bool idle = t0 + (tid / 32) * 8 >= a.T;
  const int per = ((S + kTileC - 1) / kTileC + a.splits - 1) / a.splits * kTileC;
  const int c_begin = blockIdx.z * per, c_end = min(S, c_begin + per);
  for (int c0 = c_begin; c0 < c_end; c0 += kTileC) {
    const int n = min(kTileC, c_end - c0);
    __syncthreads();  // Q is stored; the previous tile has been read by every thread
    for (int e = tid; e < kTileC * hd4; e += kTileThreads) {
      const int j = e % kTileC, d = (e / kTileC) * 4;
      store_transposed(sKt, kTileC, d, j, j < n ? *reinterpret_cast<const float4*>(column(a, kvh, c0 + j).k + d) : make_float4(0.f, 0.f, 0.f, 0.f));
    }
    for (int e = tid; e < kTileC * hd4; e += kTileThreads) {  // V row-major: dimensions fastest
      const int j = e / hd4, d = (e % hd4) * 4;
      *reinterpret_cast<float4*>(sV + j * hd + d) =
          j < n ? *reinterpret_cast<const float4*>(column(a, kvh, c0 + j).v + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (tid < kTileC) {
      const Column col = tid < n ? column(a, kvh, c0 + tid) : Column{nullptr, nullptr, 0.f, 0.f};
      s_bias[tid] = col.bias;
      s_vscale[tid] = col.vscale;
    }
    __syncthreads();

    if (!idle) {
      float sc[4][4] = {};
      for (int d = 0; d < hd; d++) {
        const float4 q4 = *reinterpret_cast<const float4*>(sQt + d * kTileQ + ty * 4);
        const float4 k4 = *reinterpret_cast<const float4*>(sKt + d * kTileC + tx * 4);
        const float qv[4] = {q4.x, q4.y, q4.z, q4.w}, kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) sc[i][j] += qv[i] * kv[j];
      }

#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int t = t0 + ty * 4 + i;
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const int jj = tx * 4 + j;
          const bool seen = t < a.T && jj < n && c0 + jj <= base + t;  // causal; past the tile's end
          sc[i][j] = seen ? sc[i][j] * a.scale + s_bias[jj] : -INFINITY;
          tile_max = fmaxf(tile_max, sc[i][j]);
        }
        const float m_new = fmaxf(m[i], warp_max<16>(tile_max));
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no column yet stays empty
        const float corr = expf(m[i] - m_use);                 // 0 on the row's first column
        float p[4], p_sum = 0.f, ps_sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          p[j] = expf(sc[i][j] - m_use);  // 0 for unseen columns
          p_sum += p[j];
          ps_sum += p[j] > 0.f ? p[j] * sc[i][j] : 0.f;
        }
        const float4 vs = *reinterpret_cast<const float4*>(s_vscale + tx * 4);
        *reinterpret_cast<float4*>(sP + (ty * 4 + i) * kTileC + tx * 4) = make_float4(p[0] * vs.x, p[1] * vs.y, p[2] * vs.z, p[3] * vs.w);
        l[i] = l[i] * corr + warp_sum<16>(p_sum);
        es[i] = es[i] * corr + warp_sum<16>(ps_sum);
        m[i] = m_new;
#pragma unroll
        for (int g = 0; g < kTileDimGroups; g++)
#pragma unroll
          for (int j = 0; j < 4; j++) acc[i][g][j] *= corr;
      }
    }
    __syncthreads();  // P is complete

    if (!idle) {
      for (int c = 0; c < n; c += 4) {  // P is 0 and V zero-filled past n
        float pr[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const float4 p4 = *reinterpret_cast<const float4*>(sP + (ty * 4 + i) * kTileC + c);
          pr[i][0] = p4.x, pr[i][1] = p4.y, pr[i][2] = p4.z, pr[i][3] = p4.w;
        }
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
#pragma unroll
          for (int g = 0; g < kTileDimGroups; g++) {
            const int d = tx * 4 + 64 * g;
            if (d >= hd) continue;
            const float4 v4 = *reinterpret_cast<const float4*>(sV + (c + cc) * hd + d);
#pragma unroll
            for (int i = 0; i < 4; i++) {
              acc[i][g][0] += pr[i][cc] * v4.x;
              acc[i][g][1] += pr[i][cc] * v4.y;
              acc[i][g][2] += pr[i][cc] * v4.z;
              acc[i][g][3] += pr[i][cc] * v4.w;
            }
          }
      }
    }
  }

  if (a.splits == 1) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int t = t0 + ty * 4 + i;
      if (t >= a.T) continue;
      float* op = a.out + (size_t(t) * a.H + h) * hd;
#pragma unroll
      for (int g = 0; g < kTileDimGroups; g++) {
        const int d = tx * 4 + 64 * g;
        if (d < hd) *reinterpret_cast<float4*>(op + d) = make_float4(acc[i][g][0] / l[i], acc[i][g][1] / l[i], acc[i][g][2] / l[i], acc[i][g][3] / l[i]);
      }
      if (a.entropy && t == a.T - 1 && tx == 0) a.entropy[h] = entropy_of(m[i], l[i], es[i]);
    }
    return;
  }
  // Split: each query's partial state (M, L, ES, Σ e^{s−M}·α·v) in the record combine_splits
  // reads; the tile's last block to finish merges every row of the tile.
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = t0 + ty * 4 + i;
    if (t >= a.T) continue;
    float* rec = a.partial + ((size_t(t) * a.H + h) * a.splits + blockIdx.z) * (hd + 3);
    if (tx == 0) rec[0] = m[i], rec[1] = l[i], rec[2] = es[i];
#pragma unroll
    for (int g = 0; g < kTileDimGroups; g++) {
      const int d = tx * 4 + 64 * g;
      if (d < hd)
#pragma unroll
        for (int j = 0; j < 4; j++) rec[3 + d + j] = acc[i][g][j];
    }
  }
  if (!finished_last(a, size_t(blockIdx.x) * a.H + h)) return;
  for (int t = t0 + tid / 32; t <= t_last; t += kTileThreads / 32) combine_splits_warp(a, t, h, tid % 32);
}

// Block (t, h, split): each warp walks every kAttnWarps-th column of the split's range; the warps
// then merge, and the block writes its partial state (M, L, ES, Σ e^{s−M}·α·v) to a.partial.
__global__ void attention_split_kernel(AttentionArgs a) {
  const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, kvh = h / (a.H / a.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hd = a.hd;

  float q[kPerLane];
  load_query(a, t, h, lane, q);
  const int S = a.S_seg + *a.n_past + t + 1;  // causal: own tokens up to and including t
  const int per = (S + a.splits - 1) / a.splits;
  const int j_end = min(S, (split + 1) * per);
  OnlineSoftmax st;
  for (int j = split * per + warp; j < j_end; j += kAttnWarps) {
    const Column col = column(a, kvh, j);
    st.add(q, col.k, col.v, col.bias, col.vscale, a.scale, hd, lane);
  }

  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps], sm_es[kAttnWarps];
  __shared__ float sm_acc[kAttnWarps][kMaxHeadDim];
  if (lane == 0) sm_m[warp] = st.m, sm_l[warp] = st.l, sm_es[warp] = st.es;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) sm_acc[warp][d] = st.acc[i];
  }
  __syncthreads();

  // The block's state over all its columns: M = −∞ (and L = 0) when its range is empty.
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; w++) M = fmaxf(M, sm_m[w]);
  float L = 0.f, ES = 0.f;
  for (int w = 0; w < kAttnWarps; w++) {
    const float f = sm_m[w] == -INFINITY ? 0.f : expf(sm_m[w] - M);
    L += sm_l[w] * f;
    ES += sm_es[w] * f;
  }
  const size_t row = size_t(t) * a.H + h;
  float* rec = a.partial + (row * a.splits + split) * (hd + 3);
  if (threadIdx.x == 0) rec[0] = M, rec[1] = L, rec[2] = ES;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kAttnWarps; w++)
      if (sm_m[w] != -INFINITY) o += sm_acc[w][d] * expf(sm_m[w] - M);
    rec[3 + d] = o;
  }

  if (finished_last(a, row)) combine_splits(a, t, h);
}

}  // namespace

void launch_embed(const DeviceMatrix& E, const int32_t* tokens, int T, float* x, cudaStream_t s) {
  embed_kernel<<<blocks_for(size_t(T) * E.cols), kThreads, 0, s>>>(E.data, E.dtype, E.cols, tokens, T, x);
  DKI_CUDA_LAUNCHED();
}

void launch_rmsnorm(const float* x, const float* w, float eps, int T, int D, float* out, cudaStream_t s) {
  rmsnorm_kernel<<<T, kThreads, 0, s>>>(x, w, eps, D, out);
  DKI_CUDA_LAUNCHED();
}

void launch_add_bias(float* y, const float* b, int T, int n, cudaStream_t s) {
  add_bias_kernel<<<blocks_for(size_t(T) * n), kThreads, 0, s>>>(y, b, T, n);
  DKI_CUDA_LAUNCHED();
}

void launch_rope(float* x, int T, int n_heads, int hd, const float* cos, const float* sin, bool interleaved, cudaStream_t s) {
  rope_kernel<<<blocks_for(size_t(T) * n_heads * (hd / 2)), kThreads, 0, s>>>(x, T, n_heads, hd, cos, sin, interleaved);
  DKI_CUDA_LAUNCHED();
}

void launch_place_segments(const SegmentPlacement* table, int n, int max_tokens, size_t rows, int S, int hd, const float* turns, bool interleaved,
                           float* seg_k, float* seg_v, cudaStream_t s) {
  if (n == 0 || max_tokens == 0) return;
  // Enough blocks to fill the GPU for one long block or many short ones, within the grid's limits.
  const unsigned x = std::min(blocks_for(rows * max_tokens * (hd / 2)), 1024u), y = unsigned(std::min(n, 65535));
  place_segments_kernel<<<dim3(x, y), kThreads, 0, s>>>(table, n, rows, S, hd, turns, interleaved, seg_k, seg_v);
  DKI_CUDA_LAUNCHED();
}

void launch_rope_store(const RopeStoreArgs& a, cudaStream_t s) {
  rope_store_kernel<<<blocks_for(size_t(a.T) * (a.H + a.Hkv) * (a.hd / 2)), kThreads, 0, s>>>(a);
  DKI_CUDA_LAUNCHED();
}

void launch_swiglu(float* gate, const float* up, size_t n, cudaStream_t s) {
  swiglu_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, n);
  DKI_CUDA_LAUNCHED();
}

void launch_scale(float* x, float a, size_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, a, n);
  DKI_CUDA_LAUNCHED();
}

void launch_absmax_bits(const float* x, size_t n, unsigned* bits, cudaStream_t s) {
  DKI_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof *bits, s));
  if (n == 0) return;
  absmax_bits_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, s>>>(x, n, bits);
  DKI_CUDA_LAUNCHED();
}

void launch_split_half(const float* x, size_t n, DType to, void* hi, void* lo, GemmScalars* sc, cudaStream_t s) {
  if (n == 0) throw Error("launch_split_half: no elements");
  if (to == DType::F16) {
    DKI_CUDA_CHECK(cudaMemsetAsync(&sc->absmax_bits, 0, sizeof sc->absmax_bits, s));
    absmax_bits_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, s>>>(x, n, &sc->absmax_bits);
    DKI_CUDA_LAUNCHED();
    split_half_kernel<__half><<<blocks_for(n), kThreads, 0, s>>>(x, n, sc, static_cast<__half*>(hi), static_cast<__half*>(lo));
  } else if (to == DType::BF16) {
    split_half_kernel<__nv_bfloat16><<<blocks_for(n), kThreads, 0, s>>>(x, n, sc, static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo));
  } else {
    throw Error(std::string("launch_split_half: cannot convert to ") + dtype_name(to));
  }
  DKI_CUDA_LAUNCHED();
}

void launch_dequant_q8_to_f16(const void* q8, size_t n, void* out, cudaStream_t s) {
  dequant_q8_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const unsigned char*>(q8), n, static_cast<__half*>(out));
  DKI_CUDA_LAUNCHED();
}

// Calls f(std::integral_constant<int, T>{}): the GEMV kernels take the token count as a
// compile-time loop bound.
template <class F>
void with_tokens(int T, const char* what, F f) {
  static_assert(kGemvMaxTokens == 4, "a case for every T up to kGemvMaxTokens");
  switch (T) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
  }
  throw Error(std::string(what) + ": " + std::to_string(T) + " tokens (1 to " + std::to_string(kGemvMaxTokens) + ")");
}

namespace {
// Launches the GEMV kernel for `units` outputs of kMatsOf<Out> rows each.
template <GemvOut Out>
void launch_gemv_units(const GemvBatch& b, size_t units, int T, const char* what, cudaStream_t s) {
  for (int p = 0; p < b.n_parts; p++)
    if (b.part[p].W.cols != b.cols) throw Error(std::string(what) + ": the parts' row lengths differ");
  const size_t warps = units * kMatsOf<Out>;
  with_tokens(T, what, [&](auto t) { gemv_kernel<decltype(t)::value, Out><<<blocks_for(warps * 32), kThreads, 0, s>>>(b); });
  DKI_CUDA_LAUNCHED();
}
}  // namespace

void launch_gemv(const GemvBatch& b, int T, cudaStream_t s) {
  if (b.n_parts < 1 || b.n_parts > kGemvParts) throw Error("launch_gemv: " + std::to_string(b.n_parts) + " parts");
  size_t rows = 0;
  for (int p = 0; p < b.n_parts; p++) rows += b.part[p].W.rows;
  launch_gemv_units<GemvOut::Plain>(b, rows, T, "launch_gemv", s);
}

void launch_gemv_swiglu(const GemvBatch& b, int T, cudaStream_t s) {
  if (b.n_parts != 2 || b.part[0].W.rows != b.part[1].W.rows)
    throw Error("launch_gemv_swiglu: needs a gate and an up projection of one shape");
  launch_gemv_units<GemvOut::Swiglu>(b, b.part[0].W.rows, T, "launch_gemv_swiglu", s);
}

void launch_gemv_qkv_rope(const GemvBatch& b, int T, cudaStream_t s) {
  const RopeStoreArgs& r = b.rope;
  const bool shaped = b.n_parts == 3 && r.hd > 0 && r.hd % 2 == 0 && b.part[0].W.rows == r.H * r.hd && b.part[1].W.rows == r.Hkv * r.hd &&
                      b.part[2].W.rows == r.Hkv * r.hd && r.cos && r.sin && r.n_past && r.k_cache && r.v_cache && b.part[0].y;
  if (!shaped) throw Error("launch_gemv_qkv_rope: needs q, k and v projections of H and Hkv heads, the angles and the cache");
  launch_gemv_units<GemvOut::QkvRope>(b, size_t(r.H + 2 * r.Hkv) * (r.hd / 2), T, "launch_gemv_qkv_rope", s);
}

// The tiled kernel's shared memory limit on the current device, raised once per device to what
// the largest head size needs or the device allows (sm_86/89 allow 99 KiB per block: not enough
// for hd 112 and 128, which then take the flash-tiled kernel).
namespace {
size_t tiled_smem_limit() {
  static std::mutex mutex;
  static auto* limits = new std::map<int, size_t>;  // never destroyed: launches may outlive statics
  int device = 0;
  DKI_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = limits->find(device);
  if (it != limits->end()) return it->second;
  int optin = 0;
  DKI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // The split merge's few static shared floats count against the same per-block limit.
  cudaFuncAttributes attr{};
  DKI_CUDA_CHECK(cudaFuncGetAttributes(&attr, attention_tiled_kernel));
  const size_t limit = std::min(size_t(optin) - std::min(size_t(optin), attr.sharedSizeBytes), tiled_smem_bytes(kTileMaxHeadDim));
  DKI_CUDA_CHECK(cudaFuncSetAttribute(attention_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit)));
  return (*limits)[device] = limit;
}
}  // namespace

void launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.hd > kMaxHeadDim) throw Error("CUDA attention supports head_dim up to " + std::to_string(kMaxHeadDim) + ", got " + std::to_string(a.hd));
  const int splits = std::max(a.splits, 1);
  if (splits > 1) {
    if (!a.partial || !a.done) throw Error("launch_attention: " + std::to_string(splits) + " splits without scratch");
    if (splits > kDecodeSplits)
      throw Error("launch_attention: " + std::to_string(splits) + " splits (the combine takes at most " + std::to_string(kDecodeSplits) + ")");
    if (a.T > kSplitMaxTokens) throw Error("launch_attention: " + std::to_string(a.T) + " queries split (at most " + std::to_string(kSplitMaxTokens) + ")");
  }
  // Decode's few queries take the split warp kernel; prefill the tiled one, split or not.
  const bool decode = splits > 1 && a.T <= kGemvMaxTokens;
  if (!decode && a.tiled && a.hd <= kTileMaxHeadDim && a.hd % 4 == 0 && tiled_smem_bytes(a.hd) <= tiled_smem_limit()) {
    attention_tiled_kernel<<<dim3((a.T + kTileQ - 1) / kTileQ, a.H, splits), kTileThreads, tiled_smem_bytes(a.hd), s>>>(a);
    DKI_CUDA_LAUNCHED();
    return;
  }
  if (splits == 1) {
    attention_prefill_kernel<<<dim3((a.T + kQueryTile - 1) / kQueryTile, a.H), kAttnWarps * 32, 0, s>>>(a);
    DKI_CUDA_LAUNCHED();
    return;
  }
  attention_split_kernel<<<dim3(a.T, a.H, splits), kAttnWarps * 32, 0, s>>>(a);
  DKI_CUDA_LAUNCHED();
}

}  // namespace dki
