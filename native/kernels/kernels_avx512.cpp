// AVX-512 VNNI kernels (Zen 4, Ice Lake and later): the Q8_0 matmul with vpdpbusd, two blocks
// per 512-bit register. Everything else is the AVX2 table's. As there, only functions marked
// DKI_AVX512 use these instructions (target attribute, never -march).
#include <immintrin.h>

#include <algorithm>

#include "kernels.h"

// GCC 12's AVX-512 headers start some intrinsics from an uninitialised register on purpose
// (_mm512_undefined_*), which -Wall reports at every use; the warning is about the header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define DKI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace dki {
namespace {

// Blocks blk and blk+1 of one Q8_0 row (activations or weights): their 64 quants, and a vector
// holding the first block's scale in lanes 0-7 and the second's in lanes 8-15 (the layout of the
// lanes vpdpbusd sums each block into). A missing second block reads as zeros with scale 0.
struct BlockPair {
  __m512i q;
  __m512 d;
};

DKI_AVX512 inline BlockPair load_pair(const unsigned char* b0, bool has_second) {
  uint16_t h0, h1 = 0;
  __builtin_memcpy(&h0, b0, 2);
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
  __m256i hi = _mm256_setzero_si256();
  if (has_second) {
    __builtin_memcpy(&h1, b0 + kQ8BlockBytes, 2);
    hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + kQ8BlockBytes + 2));
  }
  const __m256i halves = _mm256_set_m128i(_mm_set1_epi16(short(h1)), _mm_set1_epi16(short(h0)));
  return {_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_cvtph_ps(halves)};
}

// vpdpbusd multiplies unsigned by signed bytes, so activations enter offset by 128 (x ^ 0x80 =
// x + 128 as unsigned) and each accumulator starts at -128·Σw, which cancels the offset exactly:
// Σ (x + 128)·w − 128·Σw = Σ x·w. No int16 step, so nothing can saturate.
template <int R, int NT>
DKI_AVX512 inline void q8_tile(const unsigned char* W, size_t row_bytes, int nb, int r, const unsigned char* xq, int t0, float* y, int ldy) {
  __m512 acc[R][NT];
  for (int a = 0; a < R; a++)
    for (int b = 0; b < NT; b++) acc[a][b] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1), offset = _mm512_set1_epi8(char(0x80));
  for (int blk = 0; blk < nb; blk += 2) {
    const size_t off = size_t(blk) * kQ8BlockBytes;
    const bool second = blk + 1 < nb;
    if (NT == 1)  // decode streams each row once: keep the rows 2R ahead in flight
      for (int a = 0; a < R; a++) _mm_prefetch(reinterpret_cast<const char*>(W + (r + a + 2 * R) * row_bytes + off), _MM_HINT_T0);
    BlockPair w[R];
    __m512i init[R];
    for (int a = 0; a < R; a++) {
      w[a] = load_pair(W + (r + a) * row_bytes + off, second);
      init[a] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, w[a].q), 7));
    }
    for (int b = 0; b < NT; b++) {
      const BlockPair x = load_pair(xq + size_t(t0 + b) * row_bytes + off, second);
      const __m512i xu = _mm512_xor_si512(x.q, offset);
      for (int a = 0; a < R; a++) {
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init[a], xu, w[a].q));
        acc[a][b] = _mm512_fmadd_ps(p, _mm512_mul_ps(w[a].d, x.d), acc[a][b]);
      }
    }
  }
  for (int a = 0; a < R; a++)
    for (int b = 0; b < NT; b++) y[size_t(t0 + b) * ldy + r + a] = _mm512_reduce_add_ps(acc[a][b]);
}

template <int R>
DKI_AVX512 inline void q8_tile_tokens(const unsigned char* W, size_t row_bytes, int nb, int r, const unsigned char* xq, int t0, int nt, float* y, int ldy) {
  switch (nt) {
    case 4: q8_tile<R, 4>(W, row_bytes, nb, r, xq, t0, y, ldy); break;
    case 3: q8_tile<R, 3>(W, row_bytes, nb, r, xq, t0, y, ldy); break;
    case 2: q8_tile<R, 2>(W, row_bytes, nb, r, xq, t0, y, ldy); break;
    default: q8_tile<R, 1>(W, row_bytes, nb, r, xq, t0, y, ldy); break;
  }
}

// Tokens per block: their activations stay in L2 while this thread's rows stream past once.
constexpr int kTokenBlock = 64;

DKI_AVX512 void matmul_q8(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy) {
  const int nb = in / kQ8Block;
  const size_t row_bytes = size_t(nb) * kQ8BlockBytes;
  for (int tb = 0; tb < T; tb += kTokenBlock) {
    const int te = std::min(tb + kTokenBlock, T);
    int r = r0;
    for (; r + 4 <= r1; r += 4)
      for (int t = tb; t < te; t += 4) q8_tile_tokens<4>(W, row_bytes, nb, r, xq, t, std::min(4, te - t), y, ldy);
    for (; r < r1; r++)
      for (int t = tb; t < te; t += 4) q8_tile_tokens<1>(W, row_bytes, nb, r, xq, t, std::min(4, te - t), y, ldy);
  }
}

}  // namespace

const Kernels& kernels_avx512() {
  static const Kernels k = [] {
    Kernels t = kernels_avx2();
    t.name = "avx512";
    t.matmul_q8 = matmul_q8;
    return t;
  }();
  return k;
}

}  // namespace dki
