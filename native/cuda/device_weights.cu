// Device discovery and the one-time upload of a model's weights.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/device_kernels.cuh"
#include "cuda/device_weights.cuh"
#include "model.h"

namespace dki {

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime reports no device";
  return n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp p{};
  DKI_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char buf[320];
  snprintf(buf, sizeof buf, "%s, %.1f GiB, compute %d.%d", p.name, double(p.totalGlobalMem) / (1 << 30), p.major, p.minor);
  return buf;
}

namespace {

// Copies host bytes into a new device buffer owned by w.
const void* upload(CudaWeights& w, const void* host, size_t bytes, const std::string& what) {
  DeviceBuffer b(bytes, what.c_str());
  DKI_CUDA_CHECK(cudaMemcpy(b.get(), host, bytes, cudaMemcpyHostToDevice));
  const void* p = b.get();
  w.bytes += bytes;
  w.buffers.push_back(std::move(b));
  return p;
}

DeviceMatrix upload_matrix(CudaWeights& w, const Matrix& m, const std::string& what) {
  const size_t n = size_t(m.rows) * m.cols;
  if (m.dtype == DType::Q8_0) w.max_q8_elements = std::max(w.max_q8_elements, n);
  return {upload(w, m.data, dtype_bytes(m.dtype, n), what), m.dtype, m.rows, m.cols};
}

const float* upload_vector(CudaWeights& w, const std::vector<float>& v, const std::string& what) {
  if (v.empty()) return nullptr;
  return static_cast<const float*>(upload(w, v.data(), v.size() * sizeof(float), what));
}

}  // namespace

std::shared_ptr<CudaWeights> cuda_upload(const Model& m, int device) {
  // Refused before any upload: the CPU takes head_dim up to limits::kHeadDim, the attention
  // kernels hold a head's row in registers and shared memory sized for kMaxHeadDim.
  if (m.config().head_dim > kMaxHeadDim)
    throw Error("the CUDA backend supports head_dim up to " + std::to_string(kMaxHeadDim) + ", this model has " +
                std::to_string(m.config().head_dim) + " (the CPU backend runs it)");
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) throw Error("CUDA was asked for but no device is usable: " + why);
  if (device < 0 || device >= n) throw Error("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " found)");
  DKI_CUDA_CHECK(cudaSetDevice(device));
  auto w = std::make_shared<CudaWeights>();
  w->device = device;
  w->embed = upload_matrix(*w, m.embeddings(), "the embedding matrix");
  w->lm_head = m.config().tie_word_embeddings ? w->embed : upload_matrix(*w, m.lm_head(), "the LM head");
  w->final_norm = upload_vector(*w, m.final_norm(), "the final norm");
  for (size_t l = 0; l < m.layers().size(); l++) {
    const LayerWeights& L = m.layers()[l];
    const std::string at = "layer " + std::to_string(l);
    CudaWeights::Layer d;
    const std::pair<const float**, const std::vector<float>*> vectors[] = {
        {&d.attn_norm, &L.attn_norm}, {&d.ffn_norm, &L.ffn_norm}, {&d.bq, &L.bq}, {&d.bk, &L.bk}, {&d.bv, &L.bv}};
    for (const auto& [dst, src] : vectors) *dst = upload_vector(*w, *src, at + " norm or bias");
    const std::pair<DeviceMatrix*, const Matrix*> matrices[] = {{&d.wq, &L.wq}, {&d.wk, &L.wk}, {&d.wv, &L.wv}, {&d.wo, &L.wo},
                                                                {&d.w_gate, &L.w_gate}, {&d.w_up, &L.w_up}, {&d.w_down, &L.w_down}};
    for (const auto& [dst, src] : matrices) *dst = upload_matrix(*w, *src, at + " projection");
    w->layers.push_back(d);
  }
  return w;
}

uint64_t cuda_weight_bytes(const CudaWeights& w) { return w.bytes; }
int cuda_weights_device(const CudaWeights& w) { return w.device; }

}  // namespace dki
