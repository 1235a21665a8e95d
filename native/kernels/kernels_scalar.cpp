// Portable kernels: plain loops the compiler may vectorise with the baseline instruction set.
#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace dki {
namespace {

inline void convert_row(const void* W, DType wt, size_t offset, int n, float* out) {
  for (int i = 0; i < n; i++) out[i] = load_as_f32(W, wt, offset + i);
}

void matmul(const void* W, DType wt, int in, int r0, int r1, const float* x, int ldx, int T, float* y, int ldy) {
  std::vector<float> row(in);
  for (int r = r0; r < r1; r++) {
    const float* w;
    if (wt == DType::F32) {
      w = static_cast<const float*>(W) + size_t(r) * in;
    } else {
      convert_row(W, wt, size_t(r) * in, in, row.data());
      w = row.data();
    }
    for (int t = 0; t < T; t++) {
      const float* xt = x + size_t(t) * ldx;
      float acc = 0.f;
      for (int i = 0; i < in; i++) acc += w[i] * xt[i];
      y[size_t(t) * ldy + r] = acc;
    }
  }
}

void quantize_q8(const float* x, int n, unsigned char* out) {
  for (int b = 0; b < n / kQ8Block; b++) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.f;
    for (int i = 0; i < kQ8Block; i++) amax = std::max(amax, std::fabs(xb[i]));
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    unsigned char* ob = out + b * kQ8BlockBytes;
    const uint16_t dh = f32_to_f16(amax / 127.f);
    std::memcpy(ob, &dh, 2);
    // nearbyint rounds half to even in the default rounding mode, as the SIMD path does.
    for (int i = 0; i < kQ8Block; i++) ob[2 + i] = static_cast<unsigned char>(int8_t(std::nearbyint(xb[i] * id)));
  }
}

void matmul_q8(const unsigned char* W, int in, int r0, int r1, const unsigned char* xq, int T, float* y, int ldy) {
  const int nb = in / kQ8Block;
  const size_t row_bytes = size_t(nb) * kQ8BlockBytes;
  for (int r = r0; r < r1; r++) {
    for (int t = 0; t < T; t++) {
      float acc = 0.f;
      for (int b = 0; b < nb; b++) {
        const unsigned char* wb = W + r * row_bytes + b * kQ8BlockBytes;
        const unsigned char* xb = xq + t * row_bytes + b * kQ8BlockBytes;
        int32_t isum = 0;
        for (int i = 0; i < kQ8Block; i++) isum += int32_t(int8_t(wb[2 + i])) * int32_t(int8_t(xb[2 + i]));
        uint16_t dw, dx;
        std::memcpy(&dw, wb, 2);
        std::memcpy(&dx, xb, 2);
        acc += float(isum) * (f16_to_f32(dw) * f16_to_f32(dx));
      }
      y[size_t(t) * ldy + r] = acc;
    }
  }
}

float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

void axpy(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void scores(const float* q, const float* k, int n, int hd, float scale, float* out) {
  for (int i = 0; i < n; i++) out[i] = dot(q, k + size_t(i) * hd, hd) * scale;
}

void weighted_sum(const float* w, const float* v, int n, int hd, float* out) {
  for (int i = 0; i < n; i++) axpy(w[i], v + size_t(i) * hd, out, hd);
}

double softmax_exp(float* x, int n) {
  float mx = x[0];
  for (int i = 1; i < n; i++) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int i = 0; i < n; i++) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

void silu_mul(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; i++) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void f16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}
void f32_to_f16_n(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
void bf16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}
void f32_to_bf16_n(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace

const Kernels& kernels_scalar() {
  static const Kernels k{"scalar", matmul, quantize_q8, matmul_q8, dot, axpy, scores, weighted_sum, weighted_sum_each<weighted_sum>, softmax_exp, silu_mul, f16_to_f32_n, f32_to_f16_n, bf16_to_f32_n, f32_to_bf16_n};
  return k;
}

}  // namespace dki
