// AVX-512 VNNI kernels (Zen 4, Ice Lake and later): the Q8_0 matmul with vpdpbusd, on eight
// repacked rows for prefill and one streamed row for decode, and the F32/F16/BF16 prefill matmul
// on 512-bit FMAs. Everything else, and what is left over, is the AVX2 table's. As there, only
// functions marked DKI_AVX512 use these instructions (target attribute, never -march).
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"

// GCC 12's AVX-512 headers start some intrinsics from an uninitialised register on purpose
// (_mm512_undefined_*), which -Wall reports at every use; the warning is about the header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define DKI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace dki {
namespace {

DKI_AVX512 inline float q8_scale_f32(const unsigned char* block) {
  uint16_t h;
  __builtin_memcpy(&h, block, 2);
  return _cvtsh_ss(h);
}

// Prefill: eight rows repacked so that one vpdpbusd serves all of them. Each 32-byte block is
// cut into four 8-byte chunks; a packed chunk holds that chunk of rows 0..7 side by side (64
// bytes), and the token's matching 8 activation bytes are broadcast to all eight places. Lanes 2i
// and 2i+1 then accumulate row i, so one int→float conversion and one FMA per block cover eight
// rows instead of one. Weights enter offset to unsigned (w ^ 0x80 = w + 128), activations stay
// signed, and the offset is cancelled by starting each lane at −128·Σx over the bytes it sums:
// the same two sums (even and odd 4-byte halves of each chunk) for every row.
constexpr int kPackRows = 8;
constexpr int kPackTokens = 8;
constexpr int kPackMinTokens = 4;  // below this, repacking costs more than it saves

// Plain bytes, not vector types, so the std::vector holding them is baseline code.
struct alignas(64) PackedBlock {
  unsigned char q[4][64];  // chunk c: bytes 8c..8c+7 of rows 0..7, offset to unsigned
  float d[16];             // lanes 2i, 2i+1: row i's scale
};

// Per token and block: the lane start values (−128·Σx of the even / odd halves) and the scale.
struct ActBlock {
  int32_t start[2];
  float d;
};

DKI_AVX512 void pack_rows(const unsigned char* W, size_t row_bytes, int nb, int r, PackedBlock* out) {
  for (int blk = 0; blk < nb; blk++) {
    PackedBlock& pb = out[blk];
    for (int i = 0; i < kPackRows; i++) {
      const unsigned char* wb = W + size_t(r + i) * row_bytes + size_t(blk) * kQ8BlockBytes;
      for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) pb.q[c][8 * i + k] = wb[2 + 8 * c + k] ^ 0x80;
      pb.d[2 * i] = pb.d[2 * i + 1] = q8_scale_f32(wb);
    }
  }
}

// Every matmul_q8 call (a thread's chunk of rows) computes these for all T tokens, so with several
// chunks a thread they cost several times over: vectorised, they stay a few percent of a chunk
// (the scalar loop was ~30% of a 72-row chunk at 128 tokens, and made prefill 9% slower once the
// thread pool cut each loop into 4 chunks a thread).
DKI_AVX512 void act_blocks(const unsigned char* xq, size_t row_bytes, int nb, int T, ActBlock* out) {
  // Bytes 8c..8c+3 of the 32 quants are "even", 8c+4..8c+7 "odd" (little-endian masks of 1s).
  const __m256i even_mask = _mm256_set1_epi64x(0x0000000001010101LL), odd_mask = _mm256_set1_epi64x(0x0101010100000000LL);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int t = 0; t < T; t++)
    for (int blk = 0; blk < nb; blk++) {
      const unsigned char* xb = xq + size_t(t) * row_bytes + size_t(blk) * kQ8BlockBytes;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 2));
      // maddubs: mask (unsigned 0/1) × quant (signed) summed in pairs, exact in int16; madd: in fours to int32.
      const __m256i e = _mm256_madd_epi16(_mm256_maddubs_epi16(even_mask, q), ones16);
      const __m256i o = _mm256_madd_epi16(_mm256_maddubs_epi16(odd_mask, q), ones16);
      // Horizontal sums of both at once: [e0+e1, e2+e3, o0+o1, o2+o3] per 128-bit half, then across.
      const __m256i h = _mm256_hadd_epi32(e, o);
      const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      const __m128i s2 = _mm_hadd_epi32(s, s);  // [even, odd, even, odd]
      const int32_t even = _mm_cvtsi128_si32(s2), odd = _mm_extract_epi32(s2, 1);
      out[size_t(t) * nb + blk] = {{-128 * even, -128 * odd}, q8_scale_f32(xb)};
    }
}

template <int NT>
DKI_AVX512 void packed_tile(const PackedBlock* P, int nb, const unsigned char* xq, size_t row_bytes, const ActBlock* A, int t0, int r, float* y, int ldy) {
  __m512 acc[NT];
  for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
  for (int blk = 0; blk < nb; blk++) {
    const PackedBlock& pb = P[blk];
    const __m512i q0 = _mm512_load_si512(pb.q[0]), q1 = _mm512_load_si512(pb.q[1]);
    const __m512i q2 = _mm512_load_si512(pb.q[2]), q3 = _mm512_load_si512(pb.q[3]);
    const __m512 dw = _mm512_load_ps(pb.d);
    for (int j = 0; j < NT; j++) {
      const unsigned char* xb = xq + size_t(t0 + j) * row_bytes + size_t(blk) * kQ8BlockBytes + 2;
      const ActBlock& a = A[size_t(t0 + j) * nb + blk];
      long long start, x0, x1, x2, x3;
      __builtin_memcpy(&start, a.start, 8);
      __builtin_memcpy(&x0, xb, 8);
      __builtin_memcpy(&x1, xb + 8, 8);
      __builtin_memcpy(&x2, xb + 16, 8);
      __builtin_memcpy(&x3, xb + 24, 8);
      __m512i p = _mm512_set1_epi64(start);
      p = _mm512_dpbusd_epi32(p, q0, _mm512_set1_epi64(x0));
      p = _mm512_dpbusd_epi32(p, q1, _mm512_set1_epi64(x1));
      p = _mm512_dpbusd_epi32(p, q2, _mm512_set1_epi64(x2));
      p = _mm512_dpbusd_epi32(p, q3, _mm512_set1_epi64(x3));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(a.d)), acc[j]);
    }
  }
  // Lanes 2i and 2i+1 hold row i: add neighbours, keep the even lanes, store eight rows.
  for (int j = 0; j < NT; j++) {
    const __m512 pairs = _mm512_add_ps(acc[j], _mm512_permute_ps(acc[j], 0xB1));
    _mm256_storeu_ps(y + size_t(t0 + j) * ldy + r, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, pairs)));
  }
}

// Calls f(std::integral_constant<int, n>()) for a run-time n in [1, kMax]: a tile's token count
// becomes a template parameter, so its accumulators are an array the compiler keeps in registers.
template <int kMax, class F>
inline void with_count(int n, F&& f) {
  if constexpr (kMax > 1)
    if (n < kMax) return with_count<kMax - 1>(n, f);
  f(std::integral_constant<int, kMax>());
}

// Decode: the rows stream past once, with one vpdpbusd per block and no shuffle-port work. The
// AVX2 loop converts both fp16 scales and broadcasts their product every block, which on a server
// Intel core all queue on one port (~10 GB/s of Q8_0 per core). Weights enter offset to unsigned,
// as for prefill; the weight's scale comes from a table of every fp16 value (broadcast straight
// from memory), the activation's from its prepared block. With decode_streams() == 2, two rows,
// one from each half of the range, are read side by side (kernels.h says why).
struct alignas(32) DecodeAct {
  int32_t start[8];  // lane 0: −128·Σx over the block; the other lanes 0
  float d[8];        // the block's scale in every lane
};

const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (size_t i = 0; i < t.size(); i++) t[i] = f16_to_f32(uint16_t(i));
    return t;
  }();
  return table.data();
}

DKI_AVX512 void decode_acts(const unsigned char* xq, int nb, DecodeAct* out) {
  for (int blk = 0; blk < nb; blk++) {
    const unsigned char* xb = xq + size_t(blk) * kQ8BlockBytes;
    int32_t sum = 0;
    for (int k = 0; k < kQ8Block; k++) sum += int8_t(xb[2 + k]);
    const float d = q8_scale_f32(xb);
    DecodeAct& a = out[blk];
    for (int i = 0; i < 8; i++) a.start[i] = i == 0 ? -128 * sum : 0, a.d[i] = d;
  }
}

template <int NR>
DKI_AVX512 void q8_rows_dot(const unsigned char* const (&w)[NR], const unsigned char* xq, const DecodeAct* acts, int nb, const float* table, int ahead, float (&out)[NR]) {
  __m256 acc[NR][2];
  for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(char(0x80));
  auto block = [&](int r, int blk, int j) DKI_AVX512 {
    const unsigned char* wb = w[r] + size_t(blk) * kQ8BlockBytes;
    uint16_t dw;
    __builtin_memcpy(&dw, wb, 2);
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2)), flip);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + size_t(blk) * kQ8BlockBytes + 2));
    const __m256i p = _mm256_dpbusd_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(acts[blk].start)), u, x);
    const __m256 px = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_load_ps(acts[blk].d));
    acc[r][j] = _mm256_fmadd_ps(px, _mm256_broadcast_ss(table + dw), acc[r][j]);
  };
  int b = 0;
  for (; b + 2 <= nb; b += 2) {
    for (int r = 0; r < NR; r++) prefetch_ahead<2 * kQ8BlockBytes>(w[r] + size_t(b) * kQ8BlockBytes, ahead);
    for (int j = 0; j < 2; j++)
      for (int r = 0; r < NR; r++) block(r, b + j, j);
  }
  for (; b < nb; b++)
    for (int r = 0; r < NR; r++) block(r, b, 0);
  for (int r = 0; r < NR; r++) out[r] = _mm512_reduce_add_ps(_mm512_zextps256_ps512(_mm256_add_ps(acc[r][0], acc[r][1])));
}

DKI_AVX512 void matmul_q8(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy) {
  const int nb = in / kQ8Block;
  const size_t row_bytes = size_t(nb) * kQ8BlockBytes;
  if (T < kPackMinTokens) {
    thread_local std::vector<DecodeAct> acts;
    acts.resize(size_t(T) * nb);
    for (int t = 0; t < T; t++) decode_acts(xq + size_t(t) * row_bytes, nb, acts.data() + size_t(t) * nb);
    const float* table = f16_table();
    const int ahead = prefetch_bytes();
    // Rows r0 + i and r0 + half + i side by side (two streams), the last one alone when the count
    // is odd; with one stream, half covers them all and rb never is a row.
    const int half = decode_streams() == 2 ? (r1 - r0 + 1) / 2 : r1 - r0;
    for (int i = 0; i < half; i++) {
      const int ra = r0 + i, rb = r0 + half + i;
      for (int t = 0; t < T; t++) {
        const unsigned char* x = xq + size_t(t) * row_bytes;
        const DecodeAct* a = acts.data() + size_t(t) * nb;
        float* yt = y + size_t(t) * ldy;
        if (rb < r1) {
          float out[2];
          q8_rows_dot<2>({W + size_t(ra) * row_bytes, W + size_t(rb) * row_bytes}, x, a, nb, table, ahead, out);
          yt[ra] = out[0], yt[rb] = out[1];
        } else {
          float out[1];
          q8_rows_dot<1>({W + size_t(ra) * row_bytes}, x, a, nb, table, ahead, out);
          yt[ra] = out[0];
        }
      }
    }
    return;
  }
  int r = r0;
  if (r1 - r0 >= kPackRows) {
    // Per thread: this call's activation sums, and one group of packed rows at a time (the
    // group stays in L1/L2 while every token streams past it once).
    thread_local std::vector<ActBlock> acts;
    thread_local std::vector<PackedBlock> packed;  // 384 B per block; alignas(64) is honoured (C++17)
    acts.resize(size_t(T) * nb);
    packed.resize(nb);
    act_blocks(xq, row_bytes, nb, T, acts.data());
    for (; r + kPackRows <= r1; r += kPackRows) {
      pack_rows(W, row_bytes, nb, r, packed.data());
      for (int t = 0; t < T; t += kPackTokens)
        with_count<kPackTokens>(std::min(kPackTokens, T - t), [&](auto nt) DKI_AVX512 { packed_tile<nt>(packed.data(), nb, xq, row_bytes, acts.data(), t, r, y, ldy); });
    }
  }
  if (r < r1) kernels_avx2().matmul_q8(W, in, r, r1, xq, T, y, ldy);
}

// F32/F16/BF16 prefill. A tile is 12 rows × 32 tokens: 24 accumulators of 16 tokens each. Every
// input step loads two vectors of 16 tokens' activations and broadcasts one weight per row, for
// 24 FMAs: ~176 bytes per 24 FMAs, where a 4 × 6 tile of dot products (rows and tokens both along
// the input) reads ~640, more than L2 delivers at FMA speed (it ran at 70 GFLOPS a core on a
// Xeon, this one at ~170). For that, the activations of a block of tokens are transposed once
// (input-major, 32 tokens per line), and 12 rows at a time are converted to fp32 once per block.
// Each sum runs along the input in order, one accumulator lane per (row, token).
constexpr int kTileRows = 12;
constexpr int kPanelTokens = 32;  // two vectors of 16 tokens
constexpr int kMinPanelTokens = 8;
constexpr size_t kTokenBlockBytes = size_t(1) << 20;  // a block's transposed activations stay in L2

DKI_AVX512 inline __m512 load16(const void* W, DType wt, size_t i, __mmask16 m) {
  switch (wt) {
    case DType::F32: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(W) + i);
    case DType::F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W) + i));
    default: return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W) + i)), 16));
  }
}

// Rows r..r+n-1 as fp32 into out[n][in].
DKI_AVX512 void rows_f32(const void* W, DType wt, int in, int r, int n, float* out) {
  for (int a = 0; a < n; a++)
    for (int i = 0; i < in; i += 16) {
      const __mmask16 m = i + 16 <= in ? __mmask16(0xFFFF) : __mmask16((1u << (in - i)) - 1);
      _mm512_mask_storeu_ps(out + size_t(a) * in + i, m, load16(W, wt, size_t(r + a) * in + i, m));
    }
}

// Tokens t0..t0+n-1 (n ≤ 32) of x, transposed into out[in][32]; tokens past n are zero.
DKI_AVX512 void transpose_panel(const float* x, int ldx, int in, int t0, int n, float* out) {
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(ldx));
  for (int h = 0; h < 2; h++) {
    const int live = std::clamp(n - 16 * h, 0, 16);
    const __mmask16 m = __mmask16((1u << live) - 1);
    const float* first = x + size_t(t0 + 16 * h) * ldx;
    for (int i = 0; i < in; i++)
      _mm512_store_ps(out + size_t(i) * kPanelTokens + 16 * h, live ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, offsets, first + i, 4) : _mm512_setzero_ps());
  }
}

// NV vectors of 16 tokens (1 for a panel of at most 16 tokens, whose other half would be zeros).
template <int MR, int NV>
DKI_AVX512 void f32_tile(const float* rows, int in, const float* panel, int t0, int nt, int r, float* y, int ldy) {
  __m512 acc[MR][NV];
  for (int a = 0; a < MR; a++)
    for (int v = 0; v < NV; v++) acc[a][v] = _mm512_setzero_ps();
  for (int i = 0; i < in; i++) {
    __m512 xv[NV];
    for (int v = 0; v < NV; v++) xv[v] = _mm512_load_ps(panel + size_t(i) * kPanelTokens + 16 * v);
    for (int a = 0; a < MR; a++) {
      const __m512 w = _mm512_set1_ps(rows[size_t(a) * in + i]);
      for (int v = 0; v < NV; v++) acc[a][v] = _mm512_fmadd_ps(w, xv[v], acc[a][v]);
    }
  }
  alignas(64) float out[MR][kPanelTokens];
  for (int a = 0; a < MR; a++)
    for (int v = 0; v < NV; v++) _mm512_store_ps(out[a] + 16 * v, acc[a][v]);
  for (int t = 0; t < nt; t++)
    for (int a = 0; a < MR; a++) y[size_t(t0 + t) * ldy + r + a] = out[a][t];
}

DKI_AVX512 void matmul(const void* W, DType wt, int in, int r0, int r1, const float* x, int ldx, int T, float* y, int ldy) {
  // Decode streams each row once: the AVX2 loop is already at the memory bound there. Below 8
  // tokens most lanes of a panel would be padding, and the AVX2 tiles (along the input) win.
  if (T < kMinPanelTokens) return kernels_avx2().matmul(W, wt, in, r0, r1, x, ldx, T, y, ldy);
  const size_t panel_floats = size_t(in) * kPanelTokens;
  const int block_panels = int(std::max<size_t>(1, kTokenBlockBytes / (panel_floats * sizeof(float))));
  thread_local std::vector<float> rows, panels;  // reused across calls: no allocation per matmul
  rows.resize(size_t(kTileRows) * in);
  panels.resize(size_t(block_panels) * panel_floats + 16);
  float* panel0 = panels.data() + (16 - reinterpret_cast<uintptr_t>(panels.data()) / sizeof(float) % 16) % 16;  // 64-byte aligned
  for (int tb = 0; tb < T; tb += block_panels * kPanelTokens) {
    const int te = std::min(T, tb + block_panels * kPanelTokens);
    for (int t = tb; t < te; t += kPanelTokens) transpose_panel(x, ldx, in, t, std::min(kPanelTokens, te - t), panel0 + size_t((t - tb) / kPanelTokens) * panel_floats);
    for (int r = r0; r < r1; r += kTileRows) {
      const int n = std::min(kTileRows, r1 - r);
      rows_f32(W, wt, in, r, n, rows.data());
      for (int t = tb; t < te; t += kPanelTokens) {
        const float* panel = panel0 + size_t((t - tb) / kPanelTokens) * panel_floats;
        const int nt = std::min(kPanelTokens, te - t);
        with_count<kTileRows>(n, [&](auto mr) DKI_AVX512 {
          if (nt > 16) f32_tile<mr, 2>(rows.data(), in, panel, t, nt, r, y, ldy);
          else f32_tile<mr, 1>(rows.data(), in, panel, t, nt, r, y, ldy);
        });
      }
    }
  }
}

// Attention scores, 16 keys at a time: one vector of partial sums per key (the query stays in
// registers), then the 16 vectors are summed lane-wise in one tree of shuffles and adds: result
// lane j = Σ lanes of v[j]. About 45 instructions for 16 dot products, where a horizontal sum per
// key takes about 8 each.
DKI_AVX512 inline __m512 sum_lanes16(const __m512 v[16]) {
  // Pairs: per 128-bit quarter, [v0(0+2), v1(0+2), v0(1+3), v1(1+3)].
  __m512 t[8];
  for (int m = 0; m < 8; m++) t[m] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * m], v[2 * m + 1]), _mm512_unpackhi_ps(v[2 * m], v[2 * m + 1]));
  // Fours: per quarter, that quarter's sums of v[4m..4m+3].
  __m512 u[4];
  for (int m = 0; m < 4; m++)
    u[m] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Across the quarters: quarter m of the result sums the four quarters of u[m].
  const __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

template <int HV>
DKI_AVX512 void scores_hv(const float* q, const float* k, int n, float scale, float* out) {
  constexpr int hd = 16 * HV;
  __m512 qv[HV];
  for (int c = 0; c < HV; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
  auto partial = [&](const float* key) DKI_AVX512 {
    __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(key));
    for (int c = 1; c < HV; c++) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(key + 16 * c), acc);
    return acc;
  };
  const __m512 s = _mm512_set1_ps(scale);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p[16];
    for (int j = 0; j < 16; j++) p[j] = partial(k + size_t(i + j) * hd);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(sum_lanes16(p), s));
  }
  for (; i < n; i++) out[i] = _mm512_reduce_add_ps(partial(k + size_t(i) * hd)) * scale;
}

DKI_AVX512 void scores(const float* q, const float* k, int n, int hd, float scale, float* out) {
  switch (hd) {
    case 32: return scores_hv<2>(q, k, n, scale, out);
    case 64: return scores_hv<4>(q, k, n, scale, out);
    case 128: return scores_hv<8>(q, k, n, scale, out);
    default: return kernels_avx2().scores(q, k, n, hd, scale, out);
  }
}

// Attention's weighted sums for up to G queries of one head at once: each value row is loaded
// once for all of them (G·HV accumulators of 16 lanes, HV = hd/16), where weighted_sum loads it
// once per query. Per output lane the sum runs over the rows in order from out's value, with
// one FMA per row, as in the AVX2 weighted_sum: the same bits.
template <int HV, int G>
DKI_AVX512 void weighted_sum_group(const float* w, int ldw, const float* v, int n, float* out, int ldo) {
  __m512 acc[G][HV];
  for (int g = 0; g < G; g++)
    for (int c = 0; c < HV; c++) acc[g][c] = _mm512_loadu_ps(out + size_t(g) * ldo + 16 * c);
  for (int i = 0; i < n; i++) {
    __m512 vi[HV];
    for (int c = 0; c < HV; c++) vi[c] = _mm512_loadu_ps(v + (size_t(i) * HV + c) * 16);
    for (int g = 0; g < G; g++) {
      const __m512 wg = _mm512_set1_ps(w[size_t(g) * ldw + i]);
      for (int c = 0; c < HV; c++) acc[g][c] = _mm512_fmadd_ps(wg, vi[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; g++)
    for (int c = 0; c < HV; c++) _mm512_storeu_ps(out + size_t(g) * ldo + 16 * c, acc[g][c]);
}

// Queries in groups of up to 16 / HV (16 accumulators), for head sizes 32, 64 and 128.
template <int HV>
DKI_AVX512 void weighted_sum_groups(const float* w, int ldw, int nq, const float* v, int n, float* out, int ldo) {
  constexpr int kGroup = 16 / HV;
  for (int j = 0; j < nq; j += kGroup)
    with_count<kGroup>(std::min(kGroup, nq - j), [&](auto g) DKI_AVX512 { weighted_sum_group<HV, g>(w + size_t(j) * ldw, ldw, v, n, out + size_t(j) * ldo, ldo); });
}

DKI_AVX512 void weighted_sum_rows(const float* w, int ldw, int nq, const float* v, int n, int hd, float* out, int ldo) {
  switch (hd) {
    case 32: return weighted_sum_groups<2>(w, ldw, nq, v, n, out, ldo);
    case 64: return weighted_sum_groups<4>(w, ldw, nq, v, n, out, ldo);
    case 128: return weighted_sum_groups<8>(w, ldw, nq, v, n, out, ldo);
    default: return kernels_avx2().weighted_sum_rows(w, ldw, nq, v, n, hd, out, ldo);
  }
}

}  // namespace

const Kernels& kernels_avx512() {
  static const Kernels k = [] {
    Kernels t = kernels_avx2();
    t.name = "avx512";
    t.matmul = matmul;
    t.matmul_q8 = matmul_q8;
    t.scores = scores;
    t.weighted_sum_rows = weighted_sum_rows;
    return t;
  }();
  return k;
}

}  // namespace dki
