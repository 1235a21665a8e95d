// Portable kernels: plain loops the compiler may vectorise with the baseline instruction set.
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
  static const Kernels k{"scalar", matmul, dot, axpy, scores, weighted_sum, f16_to_f32_n, f32_to_f16_n, bf16_to_f32_n, f32_to_bf16_n};
  return k;
}

}  // namespace dki
