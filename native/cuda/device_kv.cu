// K/V blocks in GPU memory: moving them between host and device, and kv_ops.h's operations on
// them without leaving the device. Each call gets a stream of its own (not the legacy default
// stream, which would wait for every context's forward pass on the device).
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_kernels.cuh"
#include "cuda/device_kv.cuh"

namespace dki {

namespace {

class CopyStream {
 public:
  explicit CopyStream(int device) {
    DKI_CUDA_CHECK(cudaSetDevice(device));
    DKI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~CopyStream() { cudaStreamDestroy(s_); }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  cudaStream_t get() const { return s_; }
  void wait() const { DKI_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

// A device block shaped like b with n_tokens tokens, on b's GPU; its tensors are uninitialised.
std::shared_ptr<KVBlock> device_like(const KVBlock& b, int n_tokens) {
  auto out = same_header(b);
  out->n_tokens = n_tokens;
  out->tokens.clear();
  out->device = std::make_shared<DeviceKV>(b.device->device, out->elements());
  return out;
}

// Tokens [from, from+n) of src's rows (layer, kv_head) into tokens [at, at+n) of dst's rows.
void copy_tokens(const KVBlock& src, int from, int n, KVBlock& dst, int at, cudaStream_t s) {
  const size_t hd = src.head_dim, rows = size_t(src.n_layers) * src.n_kv_heads, f = sizeof(float);
  const size_t width = size_t(n) * hd * f, spitch = size_t(src.n_tokens) * hd * f, dpitch = size_t(dst.n_tokens) * hd * f;
  DKI_CUDA_CHECK(cudaMemcpy2DAsync(dst.device->k.get<float>() + at * hd, dpitch, src.device->k.get<float>() + from * hd, spitch, width, rows,
                                   cudaMemcpyDeviceToDevice, s));
  DKI_CUDA_CHECK(cudaMemcpy2DAsync(dst.device->v.get<float>() + at * hd, dpitch, src.device->v.get<float>() + from * hd, spitch, width, rows,
                                   cudaMemcpyDeviceToDevice, s));
}

// Rotates every key of a device block by `delta` positions in place: the rotary kernel of the
// forward pass, with every (layer, head, token) row as one head at the same angles.
void rotate_keys(KVBlock& b, int delta, const std::vector<double>& inv_freq, bool interleaved, cudaStream_t s) {
  if (delta == 0) return;
  const int half = b.head_dim / 2;
  std::vector<float> cs(2 * half);
  for (int i = 0; i < half; i++) {
    cs[i] = float(std::cos(double(delta) * inv_freq[i]));
    cs[half + i] = float(std::sin(double(delta) * inv_freq[i]));
  }
  DeviceBuffer angles(cs.size() * sizeof(float), "rotary angles");
  DKI_CUDA_CHECK(cudaMemcpyAsync(angles.get(), cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  const size_t rows = size_t(b.n_layers) * b.n_kv_heads * b.n_tokens;
  launch_rope(b.device->k.get<float>(), 1, int(rows), b.head_dim, angles.get<float>(), angles.get<float>() + half, interleaved, s);
  DKI_CUDA_CHECK(cudaStreamSynchronize(s));  // before `angles` is freed
}

}  // namespace

int device_kv_device(const DeviceKV& d) { return d.device; }
uint64_t device_kv_bytes(const DeviceKV& d) { return d.k.bytes() + d.v.bytes(); }

std::shared_ptr<const KVBlock> cuda_block_to_device(std::shared_ptr<const KVBlock> b, int device) {
  if (b->device && b->device->device == device) return b;
  const size_t n = b->elements(), bytes = n * sizeof(float);
  auto out = same_header(*b);
  CopyStream s(device);
  auto d = std::make_shared<DeviceKV>(device, n);
  if (b->device) {  // on another GPU
    DKI_CUDA_CHECK(cudaMemcpyPeerAsync(d->k.get(), device, b->device->k.get(), b->device->device, bytes, s.get()));
    DKI_CUDA_CHECK(cudaMemcpyPeerAsync(d->v.get(), device, b->device->v.get(), b->device->device, bytes, s.get()));
  } else {
    DKI_CUDA_CHECK(cudaMemcpyAsync(d->k.get(), host_kv(*b, "toDevice").k.data(), bytes, cudaMemcpyHostToDevice, s.get()));
    DKI_CUDA_CHECK(cudaMemcpyAsync(d->v.get(), b->v.data(), bytes, cudaMemcpyHostToDevice, s.get()));
  }
  s.wait();
  out->device = std::move(d);
  return out;
}

std::shared_ptr<const KVBlock> cuda_block_to_host(std::shared_ptr<const KVBlock> b) {
  if (!b->device) return b;
  const DeviceKV& d = *b->device;
  auto out = same_header(*b);
  out->k.resize(d.elements);
  out->v.resize(d.elements);
  CopyStream s(d.device);
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->k.data(), d.k.get(), d.elements * sizeof(float), cudaMemcpyDeviceToHost, s.get()));
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->v.data(), d.v.get(), d.elements * sizeof(float), cudaMemcpyDeviceToHost, s.get()));
  s.wait();
  return out;
}

}  // namespace dki

namespace dki {

std::shared_ptr<const KVBlock> cuda_scale_values(const KVBlock& b, float alpha) {
  CopyStream s(b.device->device);
  auto out = device_like(b, b.n_tokens);
  out->tokens = b.tokens;
  const size_t bytes = b.elements() * sizeof(float);
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->device->k.get(), b.device->k.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->device->v.get(), b.device->v.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
  launch_scale(out->device->v.get<float>(), alpha, b.elements(), s.get());
  s.wait();
  return out;
}

std::shared_ptr<const KVBlock> cuda_remap_positions(const KVBlock& b, int new_start, const std::vector<double>& inv_freq, bool interleaved) {
  CopyStream s(b.device->device);
  auto out = device_like(b, b.n_tokens);
  out->tokens = b.tokens;
  out->start_pos = new_start;
  copy_tokens(b, 0, b.n_tokens, *out, 0, s.get());
  rotate_keys(*out, new_start - b.start_pos, inv_freq, interleaved, s.get());
  s.wait();
  return out;
}

std::shared_ptr<const KVBlock> cuda_slice_block(const KVBlock& b, int from, int to) {
  CopyStream s(b.device->device);
  auto out = device_like(b, to - from);
  out->start_pos = b.start_pos + from;
  out->tokens.assign(b.tokens.begin() + from, b.tokens.begin() + to);
  copy_tokens(b, from, to - from, *out, 0, s.get());
  s.wait();
  return out;
}

std::shared_ptr<const KVBlock> cuda_concat_blocks(const std::vector<std::shared_ptr<const KVBlock>>& blocks, int total,
                                                   const std::vector<double>& inv_freq, bool interleaved) {
  const KVBlock& first = *blocks[0];
  for (const auto& b : blocks)
    if (!b->device || b->device->device != first.device->device)
      throw Error("concat: blocks must all be in host memory or all on the same GPU");
  CopyStream s(first.device->device);
  auto out = device_like(first, total);
  int at = 0;
  for (const auto& b : blocks) {
    const int want = first.start_pos + at;
    auto placed = b->start_pos == want ? b : cuda_remap_positions(*b, want, inv_freq, interleaved);
    copy_tokens(*placed, 0, b->n_tokens, *out, at, s.get());
    s.wait();  // before `placed` can be freed
    out->tokens.insert(out->tokens.end(), b->tokens.begin(), b->tokens.end());
    at += b->n_tokens;
  }
  return out;
}

}  // namespace dki
