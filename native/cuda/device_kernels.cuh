// Device kernels of the CUDA forward pass, each behind a plain launcher. Shapes follow
// forward.cpp: T tokens, D hidden, H / Hkv heads, hd head dim; activations are fp32 row-major.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common.h"

namespace dki {

// A weight matrix in device memory, [rows, cols] row-major as Hugging Face stores it.
struct DeviceMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rows = 0, cols = 0;
};

// Up to this many tokens a projection is a GEMV (each weight row read once for all of them);
// above, a cuBLAS GEMM.
constexpr int kGemvMaxTokens = 4;

void launch_embed(const DeviceMatrix& E, const int32_t* tokens, int T, float* x, cudaStream_t s);
void launch_rmsnorm(const float* x, const float* w, float eps, int T, int D, float* out, cudaStream_t s);
void launch_add_bias(float* y, const float* b, int T, int n, cudaStream_t s);
// cos/sin: [T, hd/2], the angles of each token's position.
void launch_rope(float* x, int T, int n_heads, int hd, const float* cos, const float* sin, bool interleaved, cudaStream_t s);
// k, v [T, Hkv, hd] → one layer's cache [Hkv, max_tokens, hd] at rows n_past..n_past+T-1.
// n_past is read from device memory, so a captured CUDA graph replays with each step's value.
void launch_store_kv(const float* k, const float* v, int T, int Hkv, int hd, float* k_cache, float* v_cache, int max_tokens,
                     const int* n_past, cudaStream_t s);
void launch_swiglu(float* gate, const float* up, size_t n, cudaStream_t s);
void launch_add(float* x, const float* y, size_t n, cudaStream_t s);
void launch_scale(float* x, float a, size_t n, cudaStream_t s);
// fp32 → F16 or BF16 (the GEMM input of a half-precision weight).
void launch_to_half(const float* x, size_t n, DType to, void* out, cudaStream_t s);
// Q8_0 blocks → F16 (a Q8_0 weight's GEMM operand in prefill).
void launch_dequant_q8_to_f16(const void* q8, size_t n, void* out, cudaStream_t s);
// y[t, r] = W[r, :] · x[t, :] for T ≤ kGemvMaxTokens, fp32 accumulation, any weight dtype.
void launch_gemv(const DeviceMatrix& W, const float* x, int T, float* y, cudaStream_t s);

// Causal attention of T queries over [segment columns ; cached own tokens ; the chunk so far].
struct AttentionArgs {
  const float* q = nullptr;  // [T, H, hd]
  float* out = nullptr;      // [T, H, hd]
  // Injected segments, all concatenated: this layer's [Hkv, S_seg, hd], and per column the
  // score bias (ln α for logit-scaled segments) and the value scale (α for value-scaled ones).
  const float* seg_k = nullptr;
  const float* seg_v = nullptr;
  const float* seg_bias = nullptr;
  const float* seg_vscale = nullptr;
  int S_seg = 0;
  const float* k_cache = nullptr;  // this layer's [Hkv, max_tokens, hd]
  const float* v_cache = nullptr;
  int max_tokens = 0;
  const int* n_past = nullptr;  // in device memory (see launch_store_kv)
  int T = 0, H = 0, Hkv = 0, hd = 0;
  float scale = 1.f;
  float* entropy = nullptr;  // [H]: attention entropy of the last query, or null
  // 1: the flash-tiled prefill kernel. More: split-K, each (query, head) row's columns cut into
  // `splits` ranges, one block each, whose partial softmax states go to `partial`
  // ([T, H, splits, hd + 3] floats) and are then merged. Decode has one query per head: without
  // the split only H blocks would stream the whole cache.
  int splits = 1;
  float* partial = nullptr;
};
// hd ≤ kMaxHeadDim.
constexpr int kMaxHeadDim = 256;
// The split-K factor of decode steps (T ≤ kGemvMaxTokens); prefill has T·H blocks already.
constexpr int kDecodeSplits = 16;
void launch_attention(const AttentionArgs& a, cudaStream_t s);

}  // namespace dki
