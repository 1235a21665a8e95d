// AMX kernels (Xeon Sapphire Rapids and later): the Q8_0 prefill matmul as int8 tile products.
// One tdpbssd multiplies 16 weight rows by 16 tokens over one 32-byte block, exactly, in int32;
// AVX-512 then applies the two blocks' scales, float(dot) · (d_w·d_x), added block by block. (The
// AVX-512 path's VNNI tile adds two half-block sums per row separately, so the paths differ in
// the last bits.) Everything else is the AVX-512 table's. Only functions marked DKI_AMX use these
// instructions, and only after Linux has granted this process the tile state.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define DKI_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace dki {

bool amx_enable() {
#if defined(__linux__) && defined(__x86_64__)
  // Linux hands out the 8 KiB of tile registers only on request (since 5.16); the grant is for
  // the whole process, so the thread pool's workers have it too.
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

namespace {

constexpr int kTile = 16;          // weight rows and tokens per tile product
constexpr int kAmxMinTokens = 4;   // from 4 tokens, padding them to 32 still beats the VNNI tiles

// The layout `ldtilecfg` reads (palette 1). A step multiplies 32 weight rows by 32 tokens over
// one 32-byte block as four products that share their operands: tiles 4 and 5 hold two groups of
// 16 rows (16 rows of the block's 32 bytes each), tiles 6 and 7 two groups of 16 tokens (in the
// order tdpbssd wants its second operand: 8 rows, each holding four consecutive bytes of every
// token), tiles 0..3 the int32 products, 16 rows × 16 tokens each.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {kTile * 4, kTile * 4, kTile * 4, kTile * 4, kQ8Block, kQ8Block, kTile * 4, kTile * 4};
  uint8_t rows[16] = {kTile, kTile, kTile, kTile, kTile, kTile, kQ8Block / 4, kQ8Block / 4};
};

// One block of a group of 16 tokens: their quantised bytes interleaved 4 by 4, and their scales
// (0 for the padding past the last token, whose bytes are 0 too).
struct alignas(64) TokenBlock {
  int8_t q[kQ8Block / 4][kTile * 4];
  float d[kTile];
};

// One block of a group of 16 weight rows: their bytes row after row, and their scales.
struct alignas(64) RowBlock {
  int8_t q[kTile][kQ8Block];
  float d[kTile];
};

// Byte offsets of 16 rows `stride` bytes apart, for gathering a dword from each.
DKI_AMX inline __m512i row_offsets(size_t stride) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int(stride)));
}

// The fp16 scales that open the Q8_0 blocks at first + offsets[i], as fp32 (0 in lanes not live).
DKI_AMX inline __m512 gather_scales(const unsigned char* first, __m512i offsets, __mmask16 live) {
  const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, first, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}

// Tokens in `groups` groups of 16; tokens past T are zero. Row kk of a packed block is dword kk
// of every token's block: one gather per row.
DKI_AMX void pack_tokens(const unsigned char* xq, size_t row_bytes, int nb, int T, int groups, TokenBlock* out) {
  const __m512i offsets = row_offsets(row_bytes);
  for (int g = 0; g < groups; g++) {
    const __mmask16 live = __mmask16((1u << std::clamp(T - g * kTile, 0, kTile)) - 1);
    const unsigned char* first = xq + size_t(g) * kTile * row_bytes;
    for (int blk = 0; blk < nb; blk++) {
      TokenBlock& tb = out[size_t(g) * nb + blk];
      const unsigned char* xb = first + size_t(blk) * kQ8BlockBytes;
      for (int kk = 0; kk < kQ8Block / 4; kk++)
        _mm512_store_si512(tb.q[kk], _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, xb + 2 + 4 * kk, 1));
      _mm512_store_ps(tb.d, gather_scales(xb, offsets, live));
    }
  }
}

// Rows r..r+15, block after block, so a product's weight tile is one contiguous 512-byte read.
DKI_AMX void pack_rows(const unsigned char* W, size_t row_bytes, int nb, int r, RowBlock* out) {
  const __m512i offsets = row_offsets(row_bytes);
  const unsigned char* first = W + size_t(r) * row_bytes;
  for (int blk = 0; blk < nb; blk++) {
    RowBlock& rb = out[blk];
    const unsigned char* wb = first + size_t(blk) * kQ8BlockBytes;
    for (int i = 0; i < kTile; i++)
      _mm256_store_si256(reinterpret_cast<__m256i*>(rb.q[i]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + size_t(i) * row_bytes + 2)));
    _mm512_store_ps(rb.d, gather_scales(wb, offsets, 0xFFFF));
  }
}

// The four products of one block into tiles 0..3. A macro, because GCC's tile intrinsics paste
// their tile numbers into the assembly text.
#define DKI_BLOCK_PRODUCTS(rows0, rows1, tokens0, tokens1) \
  do {                                                     \
    _tile_loadd(4, (rows0).q, kQ8Block);                   \
    _tile_loadd(5, (rows1).q, kQ8Block);                   \
    _tile_loadd(6, (tokens0).q, kTile * 4);                \
    _tile_loadd(7, (tokens1).q, kTile * 4);                \
    _tile_zero(0);                                         \
    _tile_zero(1);                                         \
    _tile_zero(2);                                         \
    _tile_zero(3);                                         \
    _tile_dpbssd(0, 4, 6);                                 \
    _tile_dpbssd(1, 4, 7);                                 \
    _tile_dpbssd(2, 5, 6);                                 \
    _tile_dpbssd(3, 5, 7);                                 \
  } while (0)

// y for 32 rows (row groups rows0, rows1) and 32 tokens (groups tokens0, tokens1). Product c is
// row group c/2 by token group c%2. Each block's products are stored to memory, the next block's
// are started, and while they run this block's are scaled into acc (acc[c][i]: row i of product
// c for its 16 tokens), the block's scales applied as float(dot) · (d_w·d_x).
DKI_AMX void tile_32x32(const RowBlock* rows0, const RowBlock* rows1, const TokenBlock* tokens0, const TokenBlock* tokens1, int nb, int r, int t0, int nt, float* y, int ldy) {
  alignas(64) int32_t prod[4][kTile][kTile];
  alignas(64) float acc[4][kTile][kTile] = {};
  DKI_BLOCK_PRODUCTS(rows0[0], rows1[0], tokens0[0], tokens1[0]);
  for (int blk = 0; blk < nb; blk++) {
    _tile_stored(0, prod[0], kTile * 4);
    _tile_stored(1, prod[1], kTile * 4);
    _tile_stored(2, prod[2], kTile * 4);
    _tile_stored(3, prod[3], kTile * 4);
    if (blk + 1 < nb) DKI_BLOCK_PRODUCTS(rows0[blk + 1], rows1[blk + 1], tokens0[blk + 1], tokens1[blk + 1]);
    for (int c = 0; c < 4; c++) {
      const float* dw = (c / 2 ? rows1 : rows0)[blk].d;
      const __m512 dx = _mm512_load_ps((c % 2 ? tokens1 : tokens0)[blk].d);
      for (int i = 0; i < kTile; i++) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dw[i]), dx);
        _mm512_store_ps(acc[c][i], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(prod[c][i])), s, _mm512_load_ps(acc[c][i])));
      }
    }
  }
  for (int c = 0; c < 4; c++)
    for (int t = 0; t < std::min(kTile, nt - (c % 2) * kTile); t++)
      for (int i = 0; i < kTile; i++) y[size_t(t0 + (c % 2) * kTile + t) * ldy + r + (c / 2) * kTile + i] = acc[c][i][t];
}

DKI_AMX void matmul_q8(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy) {
  if (T < kAmxMinTokens || r1 - r0 < 2 * kTile) return kernels_avx512().matmul_q8(W, in, r0, r1, xq, T, y, ldy);
  const int nb = in / kQ8Block;
  const size_t row_bytes = size_t(nb) * kQ8BlockBytes;
  const int groups = (T + 2 * kTile - 1) / (2 * kTile) * 2;  // even: the last pair may be padding
  // Per thread: this call's tokens in tile order, and 32 rows at a time (they stay in L2 while
  // every pair of token groups passes them).
  thread_local std::vector<TokenBlock> tokens;
  thread_local std::vector<RowBlock> rows;
  tokens.resize(size_t(groups) * nb);
  rows.resize(size_t(2) * nb);
  pack_tokens(xq, row_bytes, nb, T, groups, tokens.data());
  // Another library in this process (llama.cpp's AMX kernels) may have configured the tiles on
  // this thread, say a libuv worker both engines run on, and count on that configuration staying.
  // So the tiles are left as they were found: the old configuration is put back, or, when there
  // was none, the tile state is released (which also spares context switches saving 8 KiB).
  alignas(64) TileConfig found;
  _tile_storeconfig(&found);
  static const TileConfig config;
  _tile_loadconfig(&config);
  int r = r0;
  for (; r + 2 * kTile <= r1; r += 2 * kTile) {
    pack_rows(W, row_bytes, nb, r, rows.data());
    pack_rows(W, row_bytes, nb, r + kTile, rows.data() + nb);
    for (int g = 0; g < groups; g += 2) {
      const TokenBlock* g0 = tokens.data() + size_t(g) * nb;
      tile_32x32(rows.data(), rows.data() + nb, g0, g0 + nb, nb, r, g * kTile, T - g * kTile, y, ldy);
    }
  }
  if (found.palette != 0) _tile_loadconfig(&found);
  else _tile_release();
  if (r < r1) kernels_avx512().matmul_q8(W, in, r, r1, xq, T, y, ldy);
}

}  // namespace

const Kernels& kernels_amx() {
  static const Kernels k = [] {
    Kernels t = kernels_avx512();
    t.name = "amx";
    t.matmul_q8 = matmul_q8;
    return t;
  }();
  return k;
}

}  // namespace dki
