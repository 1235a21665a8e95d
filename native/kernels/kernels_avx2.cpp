// AVX2 + FMA + F16C kernels. Only this file is compiled for those instructions (through the
// target attribute, not -march), and it calls nothing outside itself, so no AVX2 code leaks
// into shared inline functions that a CPU without AVX2 might execute.
#include <immintrin.h>

#include "kernels.h"

#define DKI_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace dki {
namespace {

// Eight weights as fp32, from any stored dtype.
DKI_AVX2 inline __m256 load8(const void* W, DType wt, size_t i) {
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

DKI_AVX2 inline float load1(const void* W, DType wt, size_t i) {
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
template <int R, int NT>
DKI_AVX2 inline void tile(const void* W, DType wt, int in, int r, const float* x, int ldx, int t0, float* y, int ldy) {
  __m256 acc[R][NT];
  for (int a = 0; a < R; a++)
    for (int b = 0; b < NT; b++) acc[a][b] = _mm256_setzero_ps();
  const size_t base0 = size_t(r) * in;
  const float* xs[NT];
  for (int b = 0; b < NT; b++) xs[b] = x + size_t(t0 + b) * ldx;
  int i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 w[R];
    for (int a = 0; a < R; a++) w[a] = load8(W, wt, base0 + size_t(a) * in + i);
    for (int b = 0; b < NT; b++) {
      __m256 xv = _mm256_loadu_ps(xs[b] + i);
      for (int a = 0; a < R; a++) acc[a][b] = _mm256_fmadd_ps(w[a], xv, acc[a][b]);
    }
  }
  for (int a = 0; a < R; a++) {
    for (int b = 0; b < NT; b++) {
      float s = hsum(acc[a][b]);
      for (int j = i; j < in; j++) s += load1(W, wt, base0 + size_t(a) * in + j) * xs[b][j];
      y[size_t(t0 + b) * ldy + r + a] = s;
    }
  }
}

template <int R>
DKI_AVX2 inline void tile_tokens(const void* W, DType wt, int in, int r, const float* x, int ldx, int t0, int nt, float* y, int ldy) {
  switch (nt) {
    case 4: tile<R, 4>(W, wt, in, r, x, ldx, t0, y, ldy); break;
    case 3: tile<R, 3>(W, wt, in, r, x, ldx, t0, y, ldy); break;
    case 2: tile<R, 2>(W, wt, in, r, x, ldx, t0, y, ldy); break;
    default: tile<R, 1>(W, wt, in, r, x, ldx, t0, y, ldy); break;
  }
}

// Tokens are processed in blocks small enough that their activations stay in L2 while every row
// of this thread's range streams past them once.
constexpr int kTokenBlock = 64;

DKI_AVX2 void matmul(const void* W, DType wt, int in, int r0, int r1, const float* x, int ldx, int T, float* y, int ldy) {
  if (T == 1) {
    // Decode: nothing to reuse across tokens, so take four rows at once for four independent
    // accumulator chains and more loads in flight.
    int r = r0;
    for (; r + 4 <= r1; r += 4) tile<4, 1>(W, wt, in, r, x, ldx, 0, y, ldy);
    for (; r < r1; r++) tile<1, 1>(W, wt, in, r, x, ldx, 0, y, ldy);
    return;
  }
  for (int tb = 0; tb < T; tb += kTokenBlock) {
    int te = tb + kTokenBlock < T ? tb + kTokenBlock : T;
    int r = r0;
    for (; r + 2 <= r1; r += 2)
      for (int t = tb; t < te; t += 4) tile_tokens<2>(W, wt, in, r, x, ldx, t, te - t < 4 ? te - t : 4, y, ldy);
    for (; r < r1; r++)
      for (int t = tb; t < te; t += 4) tile_tokens<1>(W, wt, in, r, x, ldx, t, te - t < 4 ? te - t : 4, y, ldy);
  }
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

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k{"avx2", matmul, dot, axpy};
  return k;
}

}  // namespace dki
