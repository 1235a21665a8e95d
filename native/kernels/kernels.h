// The hot loops of the engine, one table per instruction set. The table is chosen at run time
// (never by -march at build time) so one binary runs on every x86-64 CPU; DKI_SIMD or
// setSimd() forces a path so tests can exercise each one a machine supports.
#pragma once
#include <string>
#include <vector>

#include "common.h"

namespace dki {

struct Kernels {
  const char* name;
  // y[t*ldy + r] = sum_i W[r*in + i] * x[t*ldx + i] for rows r in [r0, r1) and tokens t in [0, T).
  // W is row-major [rows, in] in dtype wt (F32, F16 or BF16: the Hugging Face Linear layout);
  // x and y are fp32. Q8_0 weights go through quantize_q8 + matmul_q8 instead.
  void (*matmul)(const void* W, DType wt, int in, int r0, int r1, const float* x, int ldx, int T, float* y, int ldy);
  // The input of a Q8_0 matmul, quantised as llama.cpp's x86 quantize_row_q8_0 does it at run
  // time (so both engines round alike): n fp32 values (n a multiple of 32) become n/32 Q8_0
  // blocks, d = max|x|/127 stored as fp16, q = round-to-nearest-even(x · 127/max|x|).
  void (*quantize_q8)(const float* x, int n, unsigned char* out);
  // y[t*ldy + r] = Σ_blocks d_w·d_x·(q_w·q_x) for Q8_0 weight rows r in [r0, r1) and T Q8_0
  // activation rows of in/32 blocks each, stored back to back; the block dots are exact integers.
  void (*matmul_q8)(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy);
  float (*dot)(const float* a, const float* b, int n);
  // y += a * x
  void (*axpy)(float a, const float* x, float* y, int n);
  // out[i] = scale * (q · k[i]) for n keys of length hd stored contiguously
  void (*scores)(const float* q, const float* k, int n, int hd, float scale, float* out);
  // out += sum_i w[i] * v[i] for n value rows of length hd stored contiguously
  void (*weighted_sum)(const float* w, const float* v, int n, int hd, float* out);
  // weighted_sum for nq queries at once (weights w[j*ldw + i], outputs out + j*ldo), summing in
  // the same order, so each output gets the same bits as from weighted_sum; a path may read each
  // value row once for all of them.
  void (*weighted_sum_rows)(const float* w, int ldw, int nq, const float* v, int n, int hd, float* out, int ldo);
  // The numerators of a softmax: x[i] ← exp(x[i] − max x) for n ≥ 1 finite scores; returns Σ x[i].
  double (*softmax_exp)(float* x, int n);
  // The SwiGLU gate: gate[i] ← silu(gate[i]) · up[i], silu(g) = g / (1 + e^−g).
  void (*silu_mul)(float* gate, const float* up, size_t n);
  // Bulk conversions for K/V storage forms (dst and src do not overlap).
  void (*f16_to_f32)(const uint16_t* src, float* dst, size_t n);
  void (*f32_to_f16)(const float* src, uint16_t* dst, size_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, size_t n);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, size_t n);
};

const Kernels& kernels_scalar();
const Kernels& kernels_avx2();    // AVX2 + FMA + F16C
const Kernels& kernels_avx512();  // the AVX2 table with AVX-512 matmuls (Q8_0 through VNNI)
const Kernels& kernels_amx();     // the AVX-512 table with an AMX-INT8 Q8_0 prefill matmul
// Asks Linux for this process's AMX tile state (once); false where it is refused or not Linux.
bool amx_enable();

// The active table.
const Kernels& kernels();
// Selects a path by name ("auto", "scalar", "avx2", "avx512", "amx"); throws if the CPU cannot run it.
void set_simd(const std::string& name);
// Throws what set_simd(name) would, without switching.
void check_simd(const std::string& name);
// Why DKI_SIMD or DKI_PREFETCH could not be honoured ("" when they were, or are unset).
const std::string& simd_env_error();
// Names of the paths this CPU can run, best last.
std::vector<std::string> available_simd();

// How far ahead (in bytes) the decode loops prefetch the weight rows they stream; 0 leaves it to
// the hardware prefetcher. A server Intel core streams one row at ~10 GB/s on its own: its L1
// has few misses in flight. Prefetching 8 KiB ahead into L2 (prefetcht1), whose queue holds more,
// lifted 1B decode on a Sapphire Rapids-class Xeon from 16.2 (no prefetch) and 17.2 (into L1) to
// 21.1 tok/s for Q8_0, and F16 from 10.5 (into L1) to 13.2. So that is the default on Intel;
// elsewhere it is 0 (a Zen 4 core streamed 30 GB/s without). DKI_PREFETCH or set_prefetch_bytes
// overrides it. Arithmetic is the same either way.
constexpr int kMaxPrefetchBytes = 1 << 20;
int prefetch_bytes();
// Throws unless 0 <= bytes <= kMaxPrefetchBytes.
void set_prefetch_bytes(int bytes);

// weighted_sum_rows for a path that has no faster form: one query at a time.
template <void (*kWeightedSum)(const float*, const float*, int, int, float*)>
void weighted_sum_each(const float* w, int ldw, int nq, const float* v, int n, int hd, float* out, int ldo) {
  for (int j = 0; j < nq; j++) kWeightedSum(w + size_t(j) * ldw, v, n, hd, out + size_t(j) * ldo);
}

// How many rows the Q8_0 decode loop streams side by side: 1, or 2 (one from each half of a
// thread's rows). A server Intel core keeps more misses in flight for two streams than for one:
// that loop went from 12.7 to 15.1 GB/s on one Xeon core, 1B Q8_0 decode from 20.3 to 23.3 tok/s.
// (The F16 loop already streams at the memory bound there; two rows did not speed it up.) So 2 is
// the default on Intel; elsewhere 1, unmeasured with 2 (a Zen 4 core streamed 30 GB/s from one
// row at a time, 18 from four adjacent rows interleaved). DKI_DECODE_STREAMS or
// set_decode_streams overrides it. Each row's sum is the same either way.
int decode_streams();
// Throws unless streams is 1 or 2.
void set_decode_streams(int streams);

// What a decode loop calls as it streams a row: prefetches into L2 the kBytes that lie `ahead`
// bytes past p (one request per cache line), or nothing when ahead is 0.
template <int kBytes>
inline void prefetch_ahead(const void* p, int ahead) {
  if (ahead == 0) return;
  const char* c = static_cast<const char*>(p) + ahead;
  for (int o = 0; o < kBytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

}  // namespace dki
