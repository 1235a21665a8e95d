// K/V blocks in GPU memory: moving them between host and device, and kv_ops.h's operations on
// them without leaving the device. Each call gets a stream of its own (not the legacy default
// stream, which would wait for every context's forward pass on the device).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

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

// --- Storage forms on the device: kv_ops.cpp's encode/decode_payload, element for element ------

constexpr int kThreads = 256;
unsigned grid_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// Key scales: one per (layer·head lh, channel c), max over tokens of |k| / 127.
__global__ void key_scales_kernel(const float* k, int LH, int T, int hd, float* scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(LH) * hd) return;
  const size_t lh = i / hd, c = i % hd;
  float m = 0.f;
  for (int t = 0; t < T; t++) m = fmaxf(m, fabsf(k[(lh * T + t) * hd + c]));
  scale[i] = m / 127.f;
}

// Value scales: one per row (layer, head, token), max over its channels of |v| / 127.
__global__ void value_scales_kernel(const float* v, size_t rows, int hd, float* scale) {
  const size_t r = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float m = 0.f;
  for (int c = 0; c < hd; c++) m = fmaxf(m, fabsf(v[r * hd + c]));
  scale[r] = m / 127.f;
}

// Element i of [lh][t][c]: its key scale (per channel) or value scale (per row).
template <bool kPerChannel>
__device__ __forceinline__ float scale_of(const float* scale, size_t i, int T, int hd) {
  return kPerChannel ? scale[(i / (size_t(T) * hd)) * hd + i % hd] : scale[i / hd];
}

template <bool kPerChannel>
__global__ void quantize_kernel(const float* x, const float* scale, size_t n, int T, int hd, int8_t* q) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = scale_of<kPerChannel>(scale, i, T, hd);
  q[i] = s > 0 ? int8_t(fminf(fmaxf(rintf(x[i] / s), -127.f), 127.f)) : int8_t(0);
}

// Elements [base, base + n) of a tensor from their int8 values q[0, n).
template <bool kPerChannel>
__global__ void dequantize_kernel(const int8_t* q, const float* scale, size_t base, size_t n, int T, int hd, float* x) {
  const size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < n) x[base + j] = float(q[j]) * scale_of<kPerChannel>(scale, base + j, T, hd);
}

template <bool kBF16>
__global__ void to_half_kernel(const float* x, size_t n, uint16_t* h) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = kBF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i])) : __half_as_ushort(__float2half_rn(x[i]));
}

template <bool kBF16>
__global__ void from_half_kernel(const uint16_t* h, size_t n, float* x) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = kBF16 ? __bfloat162float(__ushort_as_bfloat16(h[i])) : __half2float(__ushort_as_half(h[i]));
}

// The int8 payload is [key scales][key int8][value scales][value int8]; on the device its parts
// sit in one scratch buffer at float-aligned offsets (the payload's own offsets need not be).
struct Int8Parts {
  size_t n, kscales, vscales;  // element counts
  size_t kq_at, vs_at, vq_at;  // offsets in the payload
  DeviceBuffer scratch;
  float* ks() const { return scratch.get<float>(); }
  float* vs() const { return ks() + kscales; }
  int8_t* kq() const { return reinterpret_cast<int8_t*>(vs() + vscales); }
  int8_t* vq() const { return kq() + n; }

  explicit Int8Parts(const KVBlock& b)
      : n(b.elements()), kscales(size_t(b.n_layers) * b.n_kv_heads * b.head_dim), vscales(size_t(b.n_layers) * b.n_kv_heads * b.n_tokens) {
    kq_at = kscales * 4;
    vs_at = kq_at + n;
    vq_at = vs_at + vscales * 4;
    scratch.allocate((kscales + vscales) * 4 + 2 * n, "an int8 K/V payload");
  }
};

void half_form(KVStorage storage, const float* x, size_t n, uint16_t* h, cudaStream_t s) {
  if (storage == KVStorage::BF16) to_half_kernel<true><<<grid_for(n), kThreads, 0, s>>>(x, n, h);
  else to_half_kernel<false><<<grid_for(n), kThreads, 0, s>>>(x, n, h);
  DKI_CUDA_LAUNCHED();
}

void from_half_form(KVStorage storage, const uint16_t* h, size_t n, float* x, cudaStream_t s) {
  if (storage == KVStorage::BF16) from_half_kernel<true><<<grid_for(n), kThreads, 0, s>>>(h, n, x);
  else from_half_kernel<false><<<grid_for(n), kThreads, 0, s>>>(h, n, x);
  DKI_CUDA_LAUNCHED();
}

// --- Uploads through pinned staging memory ------------------------------------------------------
//
// A payload in pageable memory (a Node Buffer, an L3 file's bytes) is not DMA'd as it is: the
// driver would copy it through a small pinned buffer of its own, synchronously. Each GPU has a
// ring of kSlots pinned chunks instead, each with a device chunk beside it. The calling worker
// thread copies (and hashes) chunk i into pinned slot i % kSlots while the copy engine moves
// chunk i − 1, and a kernel turns each chunk from its stored form into the block's fp32. Device
// memory beyond the block itself: the ring and the int8 scales of the block being restored.

constexpr int kSlots = 2;

// DKI_CUDA_STAGING_CHUNK (bytes) sets the chunk size; tests make it tiny to cross every boundary.
size_t staging_chunk_bytes() {
  const char* env = std::getenv("DKI_CUDA_STAGING_CHUNK");
  if (!env) return size_t(4) << 20;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env == '\0' || *end != '\0' || v < 16 || v > (1ull << 30) || v % 16 != 0)
    throw Error(std::string("DKI_CUDA_STAGING_CHUNK must be a multiple of 16 bytes from 16 to 1 GiB, not \"") + env + "\"");
  return size_t(v);
}

struct UploadLane {
  std::mutex mutex;  // one upload at a time per GPU: they share the ring (and PCIe)
  cudaStream_t stream = nullptr;
  size_t chunk = 0;
  PinnedBuffer host[kSlots];
  DeviceBuffer dev[kSlots];
  cudaEvent_t reusable[kSlots] = {};  // recorded after the last work that reads the slot
  DeviceBuffer scales;                // int8 key scales, then value scales; grows as needed

  explicit UploadLane(int device) : chunk(staging_chunk_bytes()) {
    DKI_CUDA_CHECK(cudaSetDevice(device));
    DKI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < kSlots; i++) {
      host[i].allocate(chunk, "K/V upload staging");
      dev[i].allocate(chunk, "K/V upload staging");
      DKI_CUDA_CHECK(cudaEventCreateWithFlags(&reusable[i], cudaEventDisableTiming));
    }
  }
};

// The lane of GPU `device`, made on first use. Never destroyed: the CUDA runtime may be gone by
// the time static objects are.
UploadLane& upload_lane(int device) {
  static std::mutex mutex;
  static std::map<int, UploadLane*> lanes;
  std::lock_guard<std::mutex> lock(mutex);
  UploadLane*& lane = lanes[device];
  if (!lane) lane = new UploadLane(device);  // a throw leaves it null, to be tried again
  return *lane;
}

// A stretch of host bytes in one stored form, and where its contents land on the device.
struct Section {
  enum Kind { Bytes, Half, Int8 } kind;
  const unsigned char* src;
  size_t bytes;
  void* dst;                  // Bytes: the device address of byte 0; otherwise the fp32 tensor
  const float* scale = nullptr;  // Int8: the tensor's scales (already uploaded by a Bytes section)
  bool per_channel = false;      // Int8: keys (per channel) or values (per row)
};

// Uploads the sections in order on the lane's stream and waits for them; each byte passes
// through `hash` on its way into pinned memory when hash is not null. Half sections are f16, or
// bf16 when storage is BF16. Chunk sizes are multiples of 16 bytes, so no element is split.
// The caller holds lane.mutex.
void upload(UploadLane& lane, const std::vector<Section>& sections, KVStorage storage, int T, int hd, Checksum64* hash) {
  cudaStream_t s = lane.stream;
  try {
    int slot = 0;
    for (const Section& sec : sections) {
      for (size_t done = 0; done < sec.bytes;) {
        const size_t n = std::min(lane.chunk, sec.bytes - done);
        DKI_CUDA_CHECK(cudaEventSynchronize(lane.reusable[slot]));
        unsigned char* pinned = lane.host[slot].get<unsigned char>();
        if (hash) hash->update_copy(sec.src + done, pinned, n);
        else std::memcpy(pinned, sec.src + done, n);
        if (sec.kind == Section::Bytes) {
          DKI_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(sec.dst) + done, pinned, n, cudaMemcpyHostToDevice, s));
        } else {
          DKI_CUDA_CHECK(cudaMemcpyAsync(lane.dev[slot].get(), pinned, n, cudaMemcpyHostToDevice, s));
          float* x = static_cast<float*>(sec.dst);
          if (sec.kind == Section::Half) {
            from_half_form(storage, lane.dev[slot].get<uint16_t>(), n / 2, x + done / 2, s);
          } else {
            const int8_t* q = lane.dev[slot].get<int8_t>();
            if (sec.per_channel) dequantize_kernel<true><<<grid_for(n), kThreads, 0, s>>>(q, sec.scale, done, n, T, hd, x);
            else dequantize_kernel<false><<<grid_for(n), kThreads, 0, s>>>(q, sec.scale, done, n, T, hd, x);
            DKI_CUDA_LAUNCHED();
          }
        }
        DKI_CUDA_CHECK(cudaEventRecord(lane.reusable[slot], s));
        slot = (slot + 1) % kSlots;
        done += n;
      }
    }
    DKI_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    cudaStreamSynchronize(s);  // nothing of this upload may still be in flight once it has failed
    cudaGetLastError();
    throw;
  }
}

}  // namespace

void cuda_encode_payload(const KVBlock& b, KVStorage storage, unsigned char* out) {
  const DeviceKV& d = *b.device;
  const size_t n = d.elements;
  const int T = b.n_tokens, hd = b.head_dim;
  const float *k = d.k.get<float>(), *v = d.v.get<float>();
  CopyStream s(d.device);
  const auto download = [&](unsigned char* to, const void* from, size_t bytes) {
    DKI_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, s.get()));
  };
  switch (storage) {
    case KVStorage::F32:
      download(out, k, n * 4);
      download(out + n * 4, v, n * 4);
      s.wait();
      return;
    case KVStorage::F16:
    case KVStorage::BF16: {
      DeviceBuffer half(4 * n, "a half-precision K/V payload");
      half_form(storage, k, n, half.get<uint16_t>(), s.get());
      half_form(storage, v, n, half.get<uint16_t>() + n, s.get());
      download(out, half.get(), 4 * n);
      s.wait();  // before `half` is freed
      return;
    }
    case KVStorage::Int8: {
      Int8Parts p(b);
      key_scales_kernel<<<grid_for(p.kscales), kThreads, 0, s.get()>>>(k, b.n_layers * b.n_kv_heads, T, hd, p.ks());
      DKI_CUDA_LAUNCHED();
      value_scales_kernel<<<grid_for(p.vscales), kThreads, 0, s.get()>>>(v, p.vscales, hd, p.vs());
      DKI_CUDA_LAUNCHED();
      quantize_kernel<true><<<grid_for(n), kThreads, 0, s.get()>>>(k, p.ks(), n, T, hd, p.kq());
      DKI_CUDA_LAUNCHED();
      quantize_kernel<false><<<grid_for(n), kThreads, 0, s.get()>>>(v, p.vs(), n, T, hd, p.vq());
      DKI_CUDA_LAUNCHED();
      download(out, p.ks(), p.kscales * 4);
      download(out + p.kq_at, p.kq(), n);
      download(out + p.vs_at, p.vs(), p.vscales * 4);
      download(out + p.vq_at, p.vq(), n);
      s.wait();
      return;
    }
  }
}

std::shared_ptr<const DeviceKV> cuda_decode_payload(const KVBlock& shape, KVStorage storage, const unsigned char* payload, int device,
                                                    Checksum64& hash) {
  const size_t n = shape.elements();
  UploadLane& lane = upload_lane(device);
  std::lock_guard<std::mutex> lock(lane.mutex);
  DKI_CUDA_CHECK(cudaSetDevice(device));
  auto d = std::make_shared<DeviceKV>(device, n);
  float *k = d->k.get<float>(), *v = d->v.get<float>();
  std::vector<Section> sections;
  switch (storage) {
    case KVStorage::F32:
      sections = {{Section::Bytes, payload, n * 4, k}, {Section::Bytes, payload + n * 4, n * 4, v}};
      break;
    case KVStorage::F16:
    case KVStorage::BF16:
      sections = {{Section::Half, payload, n * 2, k}, {Section::Half, payload + n * 2, n * 2, v}};
      break;
    case KVStorage::Int8: {
      // [key scales][key int8][value scales][value int8]; the scales land in the lane's buffer.
      const size_t kscales = size_t(shape.n_layers) * shape.n_kv_heads * shape.head_dim;
      const size_t vscales = size_t(shape.n_layers) * shape.n_kv_heads * shape.n_tokens;
      const size_t want = (kscales + vscales) * sizeof(float);
      if (lane.scales.bytes() < want) lane.scales.allocate(want, "int8 K/V scales");
      float* ks = lane.scales.get<float>();
      float* vs = ks + kscales;
      const unsigned char* p = payload;
      sections = {{Section::Bytes, p, kscales * 4, ks},
                  {Section::Int8, p + kscales * 4, n, k, ks, true},
                  {Section::Bytes, p + kscales * 4 + n, vscales * 4, vs},
                  {Section::Int8, p + kscales * 4 + n + vscales * 4, n, v, vs, false}};
      break;
    }
  }
  upload(lane, sections, storage, shape.n_tokens, shape.head_dim, &hash);
  return d;
}

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
    s.wait();
  } else {
    const auto* k = reinterpret_cast<const unsigned char*>(host_kv(*b, "toDevice").k.data());
    const auto* v = reinterpret_cast<const unsigned char*>(b->v.data());
    UploadLane& lane = upload_lane(device);
    std::lock_guard<std::mutex> lock(lane.mutex);
    upload(lane, {{Section::Bytes, k, bytes, d->k.get()}, {Section::Bytes, v, bytes, d->v.get()}}, KVStorage::F32, 0, 0, nullptr);
  }
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
