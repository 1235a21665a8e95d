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
// Rotary embedding of a chunk's queries (in place) and keys, which go with the values into one
// layer's cache [Hkv, max_tokens, hd] at rows n_past..n_past+T-1. n_past is read from device
// memory, so a captured CUDA graph replays with each step's value.
struct RopeStoreArgs {
  float* q = nullptr;  // [T, H, hd]
  float* k = nullptr;  // [T, Hkv, hd]: a prefill's projections write them, the store reads them
  float* v = nullptr;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  const float* cos = nullptr;  // [T, hd/2]: the angles of each token's position
  const float* sin = nullptr;
  const int* n_past = nullptr;
  int T = 0, H = 0, Hkv = 0, hd = 0, max_tokens = 0;
  bool interleaved = false;
};
void launch_rope_store(const RopeStoreArgs& a, cudaStream_t s);
// cos/sin: [T, hd/2]. Rotates x [T, n_heads, hd] in place (a K/V block's keys being remapped).
void launch_rope(float* x, int T, int n_heads, int hd, const float* cos, const float* sin, bool interleaved, cudaStream_t s);
// Where one injected block goes in a context's segment buffers ([rows][S][hd], rows = layers ×
// K/V heads): its rows, at k and v and `pitch` floats apart, land at token column `off`, the keys
// rotated by rotation `turn` of the turns table (cos then sin of the move's angles, hd/2 each;
// −1: none). A block already in place (uploaded there from host memory) names the buffers'
// own rows: its keys are rotated in place and its values left as they are.
struct SegmentPlacement {
  const float* k = nullptr;
  const float* v = nullptr;
  size_t pitch = 0;
  int n_tokens = 0, off = 0, turn = -1;
};
// Places the n blocks of `table` (device memory, each at most max_tokens long) in one launch.
void launch_place_segments(const SegmentPlacement* table, int n, int max_tokens, size_t rows, int S, int hd, const float* turns, bool interleaved,
                           float* seg_k, float* seg_v, cudaStream_t s);
void launch_swiglu(float* gate, const float* up, size_t n, cudaStream_t s);
void launch_scale(float* x, float a, size_t n, cudaStream_t s);
// *bits = the float bits of max |x[i]| (≥ 0x7f800000 when any x[i] is NaN or ±inf), in stream order.
void launch_absmax_bits(const float* x, size_t n, unsigned* bits, cudaStream_t s);
// The scalars of the prefill GEMMs, in device memory (cuBLAS in device pointer mode): a kernel
// sets a GEMM's alpha in stream order, with no sync and inside a captured graph.
struct GemmScalars {
  float one = 1.f, zero = 0.f;
  float alpha = 1.f;         // of the GEMMs of the last split input: 1/s
  unsigned absmax_bits = 0;  // max|x| of that input, as float bits
};
// fp32 x·s → hi + lo in F16 or BF16 (the two GEMM inputs that carry an activation past a half
// weight), s a power of two that keeps F16 in range (1 for BF16); sets sc->alpha = 1/s.
void launch_split_half(const float* x, size_t n, DType to, void* hi, void* lo, GemmScalars* sc, cudaStream_t s);
// Q8_0 blocks → F16 (a Q8_0 weight's GEMM operand in prefill).
void launch_dequant_q8_to_f16(const void* q8, size_t n, void* out, cudaStream_t s);

// Decode projections, T ≤ kGemvMaxTokens: y[t, r] (+)= W[r, :] · x[t, :] + bias[r] with fp32
// accumulation, for up to kGemvParts matrices of one input in one launch (q, k and v).
struct GemvPart {
  DeviceMatrix W;
  const float* bias = nullptr;  // [W.rows] or null
  float* y = nullptr;           // [T, W.rows]
};
constexpr int kGemvParts = 3;
struct GemvBatch {
  GemvPart part[kGemvParts];
  int n_parts = 0;
  int cols = 0;               // every part's W.cols
  const float* x = nullptr;   // [T, cols]
  bool accumulate = false;    // y += (the residual stream) instead of y =
  // When set, x is the residual stream and each row is RMS-normalised with these gains ([cols])
  // and eps on the way in: the norm costs no launch and its output no trip through memory.
  const float* norm = nullptr;
  float eps = 0.f;
  // launch_gemv_qkv_rope: the rotary angles, n_past and this layer's cache (its q, k, v unused).
  RopeStoreArgs rope;
};
void launch_gemv(const GemvBatch& b, int T, cudaStream_t s);
// part[0].y[t, r] = silu(Wg[r, :] · x[t, :]) · (Wu[r, :] · x[t, :]) for part[0] = the gate and
// part[1] = the up projection (its y unused): the MLP's hidden layer in one pass.
void launch_gemv_swiglu(const GemvBatch& b, int T, cudaStream_t s);
// part[0..2] = q, k, v projections (with their biases): q rotated into part[0].y, k rotated and v
// as it is into rows n_past.. of b.rope's cache (part[1].y, part[2].y unused). Decode's q/k/v
// projection and launch_rope_store in one launch.
void launch_gemv_qkv_rope(const GemvBatch& b, int T, cudaStream_t s);

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
  const int* n_past = nullptr;  // in device memory (see RopeStoreArgs)
  int T = 0, H = 0, Hkv = 0, hd = 0;
  float scale = 1.f;
  float* entropy = nullptr;  // [H]: attention entropy of the last query, or null
  // 1: one block per (query tile, head) walks every column. More: split-K, each row's columns cut
  // into `splits` ranges, one block each, whose partial softmax states go to `partial`
  // ([T, H, splits, hd + 3] floats) and are merged by the last block to finish, which `done`
  // ([T, H] counts, zero between launches) tells. Decode has one query per head, and a short
  // prompt after a long injected memory one tile of queries: without the split only H blocks
  // would walk all the columns, one tile after another.
  int splits = 1;
  float* partial = nullptr;
  int* done = nullptr;
  // Prefill (splits 1) through the register-tiled kernel (head sizes up to 128, multiples of 4,
  // within the device's shared memory per block; others take the warp kernel). The default;
  // a context made with DKI_CUDA_ATTENTION=warp leaves it off.
  bool tiled = false;
};
// hd ≤ kMaxHeadDim.
constexpr int kMaxHeadDim = 256;
// The split-K factor of decode steps (T ≤ kGemvMaxTokens), and the most splits of any launch.
constexpr int kDecodeSplits = 16;
// A prefill chunk of up to this many tokens (one tile of queries) may split its columns too:
// partial and done hold this many rows.
constexpr int kSplitMaxTokens = 64;
void launch_attention(const AttentionArgs& a, cudaStream_t s);

}  // namespace dki
