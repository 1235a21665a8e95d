// AVX2 + FMA + F16C kernels. Only the functions marked DKI_AVX2 are compiled for those
// instructions (through the target attribute, not -march). Shared code they call (std::vector)
// is compiled for the baseline, so no AVX2 instruction leaks into code other CPUs execute.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.h"

#define DKI_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace dki {
namespace {

// Eight weights as fp32 from F32, F16 or BF16 storage.
template <DType WT>
DKI_AVX2 inline __m256 load8(const void* W, size_t i) {
  constexpr DType wt = WT;
  switch (wt) {
    case DType::F32: return _mm256_loadu_ps(static_cast<const float*>(W) + i);
    case DType::F16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(W) + i)));
    default: {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(W) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType WT>
DKI_AVX2 inline float load1(const void* W, size_t i) {
  constexpr DType wt = WT;
  switch (wt) {
    case DType::F32: return static_cast<const float*>(W)[i];
    case DType::F16: return _cvtsh_ss(static_cast<const uint16_t*>(W)[i]);
    default: {
      uint32_t bits = uint32_t(static_cast<const uint16_t*>(W)[i]) << 16;
      float f;
      __builtin_memcpy(&f, &bits, 4);
      return f;
    }
  }
}

DKI_AVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Micro-kernel: rows r, r+1 (R = 1 or 2) against tokens t0..t0+NT-1 (NT <= 4). Each chunk of
// eight weights is converted once and used for every token: that reuse is what makes prefill
// faster per token than decode.
template <DType WT, int R, int NT>
DKI_AVX2 inline void tile(const void* W, int in, int r, const float* x, int ldx, int t0, float* y, int ldy) {
  __m256 acc[R][NT];
  for (int a = 0; a < R; a++)
    for (int b = 0; b < NT; b++) acc[a][b] = _mm256_setzero_ps();
  const size_t base0 = size_t(r) * in;
  const float* xs[NT];
  for (int b = 0; b < NT; b++) xs[b] = x + size_t(t0 + b) * ldx;
  int i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 w[R];
    for (int a = 0; a < R; a++) w[a] = load8<WT>(W, base0 + size_t(a) * in + i);
    for (int b = 0; b < NT; b++) {
      __m256 xv = _mm256_loadu_ps(xs[b] + i);
      for (int a = 0; a < R; a++) acc[a][b] = _mm256_fmadd_ps(w[a], xv, acc[a][b]);
    }
  }
  for (int a = 0; a < R; a++) {
    for (int b = 0; b < NT; b++) {
      float s = hsum(acc[a][b]);
      for (int j = i; j < in; j++) s += load1<WT>(W, base0 + size_t(a) * in + j) * xs[b][j];
      y[size_t(t0 + b) * ldy + r + a] = s;
    }
  }
}

// Prefill tiles read fp32 rows (converted once per token block).
template <int R>
DKI_AVX2 inline void tile_tokens(const float* W, int in, int r, const float* x, int ldx, int t0, int nt, float* y, int ldy) {
  switch (nt) {
    case 4: tile<DType::F32, R, 4>(W, in, r, x, ldx, t0, y, ldy); break;
    case 3: tile<DType::F32, R, 3>(W, in, r, x, ldx, t0, y, ldy); break;
    case 2: tile<DType::F32, R, 2>(W, in, r, x, ldx, t0, y, ldy); break;
    default: tile<DType::F32, R, 1>(W, in, r, x, ldx, t0, y, ldy); break;
  }
}

// Decode: nothing to reuse across tokens, so all that matters is how fast one core streams the
// weights. One row at a time with four independent accumulators is a single sequential stream the
// hardware prefetcher follows: 30 GB/s of F16 on one Zen 4 core, against 18 GB/s with four rows
// interleaved. A server Intel core needs a software prefetch far ahead as well (prefetch_bytes()).
template <DType WT>
DKI_AVX2 inline float row_dot(const void* W, size_t base, int in, const float* x, int ahead) {
  constexpr int kStep = 32 * (WT == DType::F32 ? 4 : 2);  // bytes of weights per iteration
  const char* w = static_cast<const char*>(W) + base * (WT == DType::F32 ? 4 : 2);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 32 <= in; i += 32) {
    prefetch_ahead<kStep>(w + size_t(i) * (kStep / 32), ahead);
    a0 = _mm256_fmadd_ps(load8<WT>(W, base + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8<WT>(W, base + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(load8<WT>(W, base + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(load8<WT>(W, base + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= in; i += 8) a0 = _mm256_fmadd_ps(load8<WT>(W, base + i), _mm256_loadu_ps(x + i), a0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < in; i++) s += load1<WT>(W, base + i) * x[i];
  return s;
}

template <DType WT>
DKI_AVX2 void matvec(const void* W, int in, int r0, int r1, const float* x, float* y) {
  const int ahead = prefetch_bytes();
  for (int r = r0; r < r1; r++) y[r] = row_dot<WT>(W, size_t(r) * in, in, x, ahead);
}

// Tokens are processed in blocks small enough that their activations stay in L2 while every row
// of this thread's range streams past them once.
constexpr int kTokenBlock = 64;
// Rows converted to fp32 at a time during prefill (they stay in L1 across the token block).
constexpr int kRowBlock = 4;

template <DType WT>
DKI_AVX2 void convert_rows(const void* W, int in, int r, int n, float* out) {
  const size_t base = size_t(r) * in, count = size_t(n) * in;
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, load8<WT>(W, base + i));
  for (; i < count; i++) out[i] = load1<WT>(W, base + i);
}

DKI_AVX2 void convert_rows(const void* W, DType wt, int in, int r, int n, float* out) {
  switch (wt) {
    case DType::F16: convert_rows<DType::F16>(W, in, r, n, out); break;
    case DType::BF16: convert_rows<DType::BF16>(W, in, r, n, out); break;
    default: convert_rows<DType::F32>(W, in, r, n, out); break;
  }
}

DKI_AVX2 void matmul(const void* W, DType wt, int in, int r0, int r1, const float* x, int ldx, int T, float* y, int ldy) {
  if (T == 1) {
    switch (wt) {
      case DType::F16: matvec<DType::F16>(W, in, r0, r1, x, y); break;
      case DType::BF16: matvec<DType::BF16>(W, in, r0, r1, x, y); break;
      default: matvec<DType::F32>(W, in, r0, r1, x, y); break;
    }
    return;
  }
  // Prefill: half-precision rows are converted to fp32 once per token block, not once per
  // four tokens; the micro-kernel then reads plain floats. The row buffer is per thread.
  thread_local std::vector<float> rows;
  if (wt != DType::F32) rows.resize(size_t(kRowBlock) * in);
  for (int tb = 0; tb < T; tb += kTokenBlock) {
    const int te = tb + kTokenBlock < T ? tb + kTokenBlock : T;
    for (int rb = r0; rb < r1; rb += kRowBlock) {
      const int nr = rb + kRowBlock < r1 ? kRowBlock : r1 - rb;
      const float* src = static_cast<const float*>(W);
      int base_row = rb;
      if (wt != DType::F32) {
        convert_rows(W, wt, in, rb, nr, rows.data());
        src = rows.data();
        base_row = 0;
      }
      // The tile writes y[.., r + a]; shift y so rows of the buffer land on rows rb...
      float* yb = y + (rb - base_row);
      int r = 0;
      for (; r + 2 <= nr; r += 2)
        for (int t = tb; t < te; t += 4) tile_tokens<2>(src, in, base_row + r, x, ldx, t, te - t < 4 ? te - t : 4, yb, ldy);
      for (; r < nr; r++)
        for (int t = tb; t < te; t += 4) tile_tokens<1>(src, in, base_row + r, x, ldx, t, te - t < 4 ? te - t : 4, yb, ldy);
    }
  }
}

// Q8_0 in integers, as llama.cpp does: activations are quantised to Q8_0 blocks too, and each
// pair of blocks is multiplied in int8 → int16 → int32, then scaled once by d_w·d_x.

DKI_AVX2 void quantize_q8(const float* x, int n, unsigned char* out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int b = 0; b < n / kQ8Block; b++) {
    const float* xb = x + b * kQ8Block;
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < kQ8Block; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 id = _mm256_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
    unsigned char* ob = out + b * kQ8BlockBytes;
    const uint16_t dh = _cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __builtin_memcpy(ob, &dh, 2);
    for (int i = 0; i < kQ8Block; i += 8) {
      const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i), id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i q = _mm256_cvtps_epi32(v);
      const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(ob + 2 + i), _mm_packs_epi16(q16, q16));
    }
  }
}

DKI_AVX2 inline float q8_scale(const unsigned char* block) {
  uint16_t d;
  __builtin_memcpy(&d, block, 2);
  return _cvtsh_ss(d);
}

// One Q8_0 row against one activation row, four blocks per step on four accumulators. maddubs
// multiplies an unsigned by a signed operand, so the weights enter as |w| and the activations
// carry w's sign (|w|, |x| ≤ 127 keep the pairwise int16 sums below saturation).
DKI_AVX2 inline float q8_row_dot(const unsigned char* w, const unsigned char* xq, int nb, int ahead) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256i ones = _mm256_set1_epi16(1);
  int b = 0;
  auto block = [&](int blk, int j) DKI_AVX2 {
    const unsigned char* wb = w + size_t(blk) * kQ8BlockBytes;
    const unsigned char* xb = xq + size_t(blk) * kQ8BlockBytes;
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 2));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
    acc[j] = _mm256_fmadd_ps(p, _mm256_set1_ps(q8_scale(wb) * q8_scale(xb)), acc[j]);
  };
  for (; b + 4 <= nb; b += 4) {
    prefetch_ahead<4 * kQ8BlockBytes>(w + size_t(b) * kQ8BlockBytes, ahead);
    for (int j = 0; j < 4; j++) block(b + j, j);
  }
  for (; b < nb; b++) block(b, 0);
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// Prefill on repacked rows, as the AVX-512 path does but four rows wide: each 32-byte block is
// cut into four 8-byte chunks, and a packed chunk holds that chunk of rows 0..3 side by side. The
// token's 8 activation bytes are broadcast to all four places; maddubs needs an unsigned operand,
// so the weights enter as |w| (packed once) and the activations take the weights' signs. Lanes 2i
// and 2i+1 then accumulate row i, and one conversion and one FMA per block serve four rows.
constexpr int kPackRows = 4;
constexpr int kPackTokens = 4;

struct alignas(32) PackedBlock4 {
  unsigned char w[4][32];     // chunk c: bytes 8c..8c+7 of rows 0..3 (signed, for the signs)
  unsigned char wabs[4][32];  // the same, |w|
  float d[8];                 // lanes 2i, 2i+1: row i's scale
};

void pack_rows4(const unsigned char* W, size_t row_bytes, int nb, int r, PackedBlock4* out) {
  for (int blk = 0; blk < nb; blk++) {
    PackedBlock4& pb = out[blk];
    for (int i = 0; i < kPackRows; i++) {
      const unsigned char* wb = W + size_t(r + i) * row_bytes + size_t(blk) * kQ8BlockBytes;
      for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) {
          const int8_t v = int8_t(wb[2 + 8 * c + k]);
          pb.w[c][8 * i + k] = static_cast<unsigned char>(v);
          pb.wabs[c][8 * i + k] = static_cast<unsigned char>(v < 0 ? -v : v);
        }
      uint16_t h;
      __builtin_memcpy(&h, wb, 2);
      pb.d[2 * i] = pb.d[2 * i + 1] = f16_to_f32(h);
    }
  }
}

template <int NT>
DKI_AVX2 void packed_tile4(const PackedBlock4* P, int nb, const unsigned char* xq, size_t row_bytes, int t0, int r, float* y, int ldy) {
  __m256 acc[NT];
  for (int j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int blk = 0; blk < nb; blk++) {
    const PackedBlock4& pb = P[blk];
    const __m256 dw = _mm256_load_ps(pb.d);
    for (int j = 0; j < NT; j++) {
      const unsigned char* xb = xq + size_t(t0 + j) * row_bytes + size_t(blk) * kQ8BlockBytes;
      __m256i sum = _mm256_setzero_si256();
      for (int c = 0; c < 4; c++) {
        long long xc;
        __builtin_memcpy(&xc, xb + 2 + 8 * c, 8);
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.w[c]));
        const __m256i wabs = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.wabs[c]));
        const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(_mm256_set1_epi64x(xc), w));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, ones));
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, _mm256_set1_ps(q8_scale(xb))), acc[j]);
    }
  }
  // Lanes (0,1) (2,3) | (4,5) (6,7) hold rows 0, 1 | 2, 3: add neighbours, keep one of each pair.
  for (int j = 0; j < NT; j++) {
    const __m256 h = _mm256_hadd_ps(acc[j], acc[j]);  // [r0 r1 r0 r1 | r2 r3 r2 r3]
    const __m128d lo = _mm_castps_pd(_mm256_castps256_ps128(h)), hi = _mm_castps_pd(_mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(y + size_t(t0 + j) * ldy + r, _mm_castpd_ps(_mm_unpacklo_pd(lo, hi)));
  }
}

DKI_AVX2 void packed_tokens4(const PackedBlock4* P, int nb, const unsigned char* xq, size_t row_bytes, int t0, int nt, int r, float* y, int ldy) {
  switch (nt) {
    case 4: packed_tile4<4>(P, nb, xq, row_bytes, t0, r, y, ldy); break;
    case 3: packed_tile4<3>(P, nb, xq, row_bytes, t0, r, y, ldy); break;
    case 2: packed_tile4<2>(P, nb, xq, row_bytes, t0, r, y, ldy); break;
    default: packed_tile4<1>(P, nb, xq, row_bytes, t0, r, y, ldy); break;
  }
}

DKI_AVX2 void matmul_q8(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy) {
  const int nb = in / kQ8Block;
  const size_t row_bytes = size_t(nb) * kQ8BlockBytes;
  int r = r0;
  if (T > 1) {
    // Prefill: one group of packed rows at a time stays in L1/L2 while every token streams past.
    thread_local std::vector<PackedBlock4> packed;
    packed.resize(nb);
    for (; r + kPackRows <= r1; r += kPackRows) {
      pack_rows4(W, row_bytes, nb, r, packed.data());
      for (int t = 0; t < T; t += kPackTokens) packed_tokens4(packed.data(), nb, xq, row_bytes, t, std::min(kPackTokens, T - t), r, y, ldy);
    }
  }
  // Decode, and prefill's rows left over: each row one sequential stream, as for F16 weights.
  const int ahead = prefetch_bytes();
  for (; r < r1; r++)
    for (int t = 0; t < T; t++) y[size_t(t) * ldy + r] = q8_row_dot(W + r * row_bytes, xq + t * row_bytes, nb, ahead);
}

DKI_AVX2 float dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

DKI_AVX2 void axpy(float a, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}

DKI_AVX2 void scores(const float* q, const float* k, int n, int hd, float scale, float* out) {
  if (hd % 8 != 0) {
    for (int i = 0; i < n; i++) out[i] = dot(q, k + size_t(i) * hd, hd) * scale;
    return;
  }
  // Four keys at a time against the same query chunk.
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float* k0 = k + size_t(i) * hd;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + c), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + c), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + c), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + c), a3);
    }
    out[i] = hsum(a0) * scale;
    out[i + 1] = hsum(a1) * scale;
    out[i + 2] = hsum(a2) * scale;
    out[i + 3] = hsum(a3) * scale;
  }
  for (; i < n; i++) out[i] = dot(q, k + size_t(i) * hd, hd) * scale;
}

DKI_AVX2 void weighted_sum(const float* w, const float* v, int n, int hd, float* out) {
  if (hd % 8 != 0 || hd > 256) {
    for (int i = 0; i < n; i++) axpy(w[i], v + size_t(i) * hd, out, hd);
    return;
  }
  // Accumulate the whole output row in registers (hd ≤ 256 → at most 32 ymm... kept in a
  // stack array the compiler keeps hot), one pass over the value rows.
  __m256 acc[32];
  const int chunks = hd / 8;
  for (int c = 0; c < chunks; c++) acc[c] = _mm256_loadu_ps(out + 8 * c);
  for (int i = 0; i < n; i++) {
    const __m256 wv = _mm256_set1_ps(w[i]);
    const float* vi = v + size_t(i) * hd;
    for (int c = 0; c < chunks; c++) acc[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(vi + 8 * c), acc[c]);
  }
  for (int c = 0; c < chunks; c++) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

// exp(x) for x ≤ 0 (softmax numerators), 8 at a time: x = n·ln2 + r with |r| ≤ ln2/2, e^r from
// Cephes' degree-6 polynomial (~1 ulp), 2^n built in the exponent bits. Below −87 the result
// would be subnormal; it is flushed to 0, which a softmax cannot tell from e^−87.
DKI_AVX2 inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

DKI_AVX2 double softmax_exp(float* x, int n) {
  __m256 mv = _mm256_set1_ps(x[0]);
  int i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  float mx = _mm_cvtss_f32(m4);
  for (; i < n; i++) mx = std::max(mx, x[i]);

  const __m256 shift = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  double sum = hsum(acc);
  for (; i < n; i++) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

// silu through the same exp: e = e^−|g| never overflows, and sigmoid(g) is 1/(1+e) for g ≥ 0,
// e/(1+e) below.
DKI_AVX2 void silu_mul(float* gate, const float* up, size_t n) {
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign));
    const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, g), _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; i++) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// Restoring a large block writes far more than the caches hold: stream those stores past the
// cache (no read-for-ownership of every destination line). Small runs stay cached for their user.
constexpr size_t kStreamFrom = size_t(1) << 16;  // elements

template <bool Stream>
DKI_AVX2 inline void store8(float* dst, __m256 v) {
  if (Stream) _mm256_stream_ps(dst, v);
  else _mm256_storeu_ps(dst, v);
}

template <bool Stream>
DKI_AVX2 void f16_to_f32_run(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store8<Stream>(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
  if (Stream) _mm_sfence();
}

template <bool Stream>
DKI_AVX2 void bf16_to_f32_run(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    store8<Stream>(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; i++) dst[i] = load1<DType::BF16>(src, i);
  if (Stream) _mm_sfence();
}

inline bool stream_to(const float* dst, size_t n) { return n >= kStreamFrom && reinterpret_cast<uintptr_t>(dst) % 32 == 0; }

DKI_AVX2 void f16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  if (stream_to(dst, n)) f16_to_f32_run<true>(src, dst, n);
  else f16_to_f32_run<false>(src, dst, n);
}

DKI_AVX2 void f32_to_f16_n(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

DKI_AVX2 void bf16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  if (stream_to(dst, n)) bf16_to_f32_run<true>(src, dst, n);
  else bf16_to_f32_run<false>(src, dst, n);
}

DKI_AVX2 void f32_to_bf16_n(const float* src, uint16_t* dst, size_t n) {
  // Round to nearest even; NaNs stay NaN (quiet bit set), as f32_to_bf16 does.
  size_t i = 0;
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x400000);
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absmask), inf);
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), nan), 16);
    // pack 8 × u32 (values < 65536) into 8 × u16
    const __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi32(lo, hi));
  }
  for (; i < n; i++) {
    uint32_t bits;
    __builtin_memcpy(&bits, src + i, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = uint16_t((bits >> 16) | 0x40);
    } else {
      bits += 0x7fffu + ((bits >> 16) & 1u);
      dst[i] = uint16_t(bits >> 16);
    }
  }
}

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k{"avx2", matmul, quantize_q8, matmul_q8, dot, axpy, scores, weighted_sum, weighted_sum_each<weighted_sum>, softmax_exp, silu_mul, f16_to_f32_n, f32_to_f16_n, bf16_to_f32_n, f32_to_bf16_n};
  return k;
}

}  // namespace dki
