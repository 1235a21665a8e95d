// K/V blocks in GPU memory: moving them between host and device (through each GPU's staging
// lane), the GPU's pool of block buffers, and kv_ops.h's operations on blocks without leaving the
// device. No call uses the legacy default stream, which would wait for every context's forward
// pass on the device: copies run on the lane's stream, the other operations on a stream each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "resources.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_kernels.cuh"
#include "cuda/device_kv.cuh"

namespace dki {

namespace {

// Refuses a device index the runtime does not have, with the GPUs it has.
void check_device(int device) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (device < 0 || device >= n)
    throw Error("there is no GPU cuda:" + std::to_string(device) + " (" + (n > 0 ? "this machine has cuda:0..cuda:" + std::to_string(n - 1) : why) + ")");
}

// A stream for one operation on device blocks. Declared after the blocks it writes: when an
// enqueue throws, it is destroyed first and waits, so no copy or kernel still writes into a
// block whose memory has gone back to the pool.
class CopyStream {
 public:
  explicit CopyStream(int device) {
    DKI_CUDA_CHECK(cudaSetDevice(device));
    DKI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~CopyStream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
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
  const std::vector<float> cs = rotation_by(delta, inv_freq);
  // From the pool: cudaMalloc/cudaFree would wait for every context's work on the GPU.
  DeviceBuffer angles;
  angles.allocate_pooled(cs.size() * sizeof(float), "rotary angles", device_block_pool(b.device->device));
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

// Elements [base, base + n) of a tensor as int8 values q[0, n).
template <bool kPerChannel>
__global__ void quantize_kernel(const float* x, const float* scale, size_t base, size_t n, int T, int hd, int8_t* q) {
  const size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const float s = scale_of<kPerChannel>(scale, base + j, T, hd);
  q[j] = s > 0 ? int8_t(fminf(fmaxf(rintf(x[base + j] / s), -127.f), 127.f)) : int8_t(0);
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

// --- Host <-> device copies through pinned staging memory -----------------------------------
//
// Payloads live in pageable memory (Node Buffers, an L3 file's bytes), which is not DMA'd as it
// is: the driver would copy it through a small pinned buffer of its own, synchronously. Each GPU
// has a staging lane instead: a ring of kSlots pinned chunks, each with a device chunk beside it.
// Uploading, the calling worker thread copies (and hashes) chunk i into pinned slot i % kSlots
// while the copy engine moves chunk i − 1, and a kernel turns each chunk from its stored form
// into the block's fp32. Downloading, a kernel writes chunk i's stored form into its device slot
// and the copy engine moves it to pinned memory while the thread copies chunk i − 1 out. Device
// memory beyond the block itself: the ring and the int8 scales of the block in transit.

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

struct StagingLane {
  std::mutex mutex;  // one transfer at a time per GPU: they share the ring (and PCIe)
  cudaStream_t stream = nullptr;
  size_t chunk = 0;
  PinnedBuffer host[kSlots];
  DeviceBuffer dev[kSlots];
  cudaEvent_t done[kSlots] = {};  // recorded after the last work enqueued on the slot
  DeviceBuffer scales;            // int8 key scales, then value scales; grows as needed

  explicit StagingLane(int device) : chunk(staging_chunk_bytes()) {
    DKI_CUDA_CHECK(cudaSetDevice(device));
    for (int i = 0; i < kSlots; i++) {
      host[i].allocate(chunk, "K/V staging");
      dev[i].allocate(chunk, "K/V staging");
    }
    // Last, so that a failure above leaves nothing behind (the buffers free themselves).
    try {
      DKI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      for (int i = 0; i < kSlots; i++) DKI_CUDA_CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    } catch (...) {
      for (cudaEvent_t e : done)
        if (e) cudaEventDestroy(e);
      if (stream) cudaStreamDestroy(stream);
      throw;
    }
  }
};

// GPU `device`'s lane, locked for the caller, who is then on that device. Lanes are made on first
// use and never destroyed: the CUDA runtime may be gone by the time static objects are.
struct LockedLane {
  StagingLane& lane;
  std::lock_guard<std::mutex> lock;
  explicit LockedLane(int device) : lane(find(device)), lock(lane.mutex) { DKI_CUDA_CHECK(cudaSetDevice(device)); }

  static StagingLane& find(int device) {
    static std::mutex mutex;
    static auto* lanes = new std::map<int, StagingLane*>;  // never destroyed either
    std::lock_guard<std::mutex> lock(mutex);
    if (lanes->find(device) == lanes->end()) check_device(device);
    StagingLane*& lane = (*lanes)[device];
    if (!lane) lane = new StagingLane(device);  // a throw leaves it null, to be tried again
    return *lane;
  }
};

// A stretch of a payload (or of a host tensor) in one stored form, and the device tensor it holds.
struct Section {
  enum Kind { Bytes, Half, Int8 } kind;
  unsigned char* host;  // byte 0 of the stretch (only read by uploads)
  size_t bytes;
  void* device;                  // Bytes: the device address of byte 0; otherwise the fp32 tensor
  const float* scale = nullptr;  // Int8: the tensor's scales, in device memory
  bool per_channel = false;      // Int8: keys (per channel) or values (per row)
  // Bytes only, when not 0: the stretch is rows of `width` bytes, contiguous on the host and
  // `pitch` bytes apart on the device (an injected block's rows in a context's segment tensor).
  size_t width = 0, pitch = 0;

  // The bytes [at, at + n) of the stretch at the device: a chunk holds whole rows, or lies in one.
  void copy_to_device(const unsigned char* from, size_t at, size_t n, cudaStream_t s) const {
    unsigned char* to = static_cast<unsigned char*>(device);
    if (width == 0) DKI_CUDA_CHECK(cudaMemcpyAsync(to + at, from, n, cudaMemcpyHostToDevice, s));
    else if (at % width == 0 && n % width == 0)
      DKI_CUDA_CHECK(cudaMemcpy2DAsync(to + at / width * pitch, pitch, from, width, width, n / width, cudaMemcpyHostToDevice, s));
    else DKI_CUDA_CHECK(cudaMemcpyAsync(to + at / width * pitch + at % width, from, n, cudaMemcpyHostToDevice, s));
  }
};

// Bytes of the section's chunk at `at`: at most the lane's chunk and, for rows, whole rows or
// the rest of one row. Chunk sizes are multiples of 16 bytes, so no element of a Half or Int8
// section is split.
size_t chunk_at(const StagingLane& lane, const Section& sec, size_t at) {
  const size_t left = sec.bytes - at;
  if (sec.width == 0) return std::min(lane.chunk, left);
  if (sec.width <= lane.chunk) return std::min(lane.chunk / sec.width * sec.width, left);
  return std::min(lane.chunk, sec.width - at % sec.width);
}

// Runs fn(section, slot, offset, n) over the sections' chunks in order, advancing the slot.
// The caller holds the lane.
template <class F>
void for_each_chunk(StagingLane& lane, const std::vector<Section>& sections, F&& fn) {
  int slot = 0;
  for (const Section& sec : sections)
    for (size_t at = 0, n = 0; at < sec.bytes; at += n) {
      n = chunk_at(lane, sec, at);
      fn(sec, slot, at, n);
      slot = (slot + 1) % kSlots;
    }
}

// Waits for the lane's stream; after a failure, lets nothing of the transfer stay in flight.
template <class F>
void on_lane(StagingLane& lane, F&& transfer) {
  try {
    transfer();
    DKI_CUDA_CHECK(cudaStreamSynchronize(lane.stream));
  } catch (...) {
    cudaStreamSynchronize(lane.stream);
    cudaGetLastError();
    throw;
  }
}

// Half sections are f16, or bf16 when storage is BF16; T and hd shape the int8 scales.
void upload(StagingLane& lane, const std::vector<Section>& sections, KVStorage storage, int T, int hd, Checksum64* hash) {
  const cudaStream_t s = lane.stream;
  on_lane(lane, [&] {
    for_each_chunk(lane, sections, [&](const Section& sec, int slot, size_t at, size_t n) {
      DKI_CUDA_CHECK(cudaEventSynchronize(lane.done[slot]));
      unsigned char* pinned = lane.host[slot].get<unsigned char>();
      if (hash) hash->update_copy(sec.host + at, pinned, n);
      else std::memcpy(pinned, sec.host + at, n);
      if (sec.kind == Section::Bytes) {
        sec.copy_to_device(pinned, at, n, s);
      } else {
        DKI_CUDA_CHECK(cudaMemcpyAsync(lane.dev[slot].get(), pinned, n, cudaMemcpyHostToDevice, s));
        float* x = static_cast<float*>(sec.device);
        if (sec.kind == Section::Half && storage == KVStorage::BF16) from_half_kernel<true><<<grid_for(n / 2), kThreads, 0, s>>>(lane.dev[slot].get<uint16_t>(), n / 2, x + at / 2);
        else if (sec.kind == Section::Half) from_half_kernel<false><<<grid_for(n / 2), kThreads, 0, s>>>(lane.dev[slot].get<uint16_t>(), n / 2, x + at / 2);
        else if (sec.per_channel) dequantize_kernel<true><<<grid_for(n), kThreads, 0, s>>>(lane.dev[slot].get<int8_t>(), sec.scale, at, n, T, hd, x);
        else dequantize_kernel<false><<<grid_for(n), kThreads, 0, s>>>(lane.dev[slot].get<int8_t>(), sec.scale, at, n, T, hd, x);
        DKI_CUDA_LAUNCHED();
      }
      DKI_CUDA_CHECK(cudaEventRecord(lane.done[slot], s));
    });
  });
}

void download(StagingLane& lane, const std::vector<Section>& sections, KVStorage storage, int T, int hd) {
  const cudaStream_t s = lane.stream;
  struct InFlight {
    unsigned char* to;
    int slot;
    size_t n;
  };
  std::optional<InFlight> behind;  // the chunk enqueued before the current one
  const auto copy_out = [&](const InFlight& c) {
    DKI_CUDA_CHECK(cudaEventSynchronize(lane.done[c.slot]));
    std::memcpy(c.to, lane.host[c.slot].get(), c.n);
  };
  on_lane(lane, [&] {
    for_each_chunk(lane, sections, [&](const Section& sec, int slot, size_t at, size_t n) {
      unsigned char* pinned = lane.host[slot].get<unsigned char>();
      if (sec.kind == Section::Bytes) {
        DKI_CUDA_CHECK(cudaMemcpyAsync(pinned, static_cast<const unsigned char*>(sec.device) + at, n, cudaMemcpyDeviceToHost, s));
      } else {
        const float* x = static_cast<const float*>(sec.device);
        if (sec.kind == Section::Half && storage == KVStorage::BF16) to_half_kernel<true><<<grid_for(n / 2), kThreads, 0, s>>>(x + at / 2, n / 2, lane.dev[slot].get<uint16_t>());
        else if (sec.kind == Section::Half) to_half_kernel<false><<<grid_for(n / 2), kThreads, 0, s>>>(x + at / 2, n / 2, lane.dev[slot].get<uint16_t>());
        else if (sec.per_channel) quantize_kernel<true><<<grid_for(n), kThreads, 0, s>>>(x, sec.scale, at, n, T, hd, lane.dev[slot].get<int8_t>());
        else quantize_kernel<false><<<grid_for(n), kThreads, 0, s>>>(x, sec.scale, at, n, T, hd, lane.dev[slot].get<int8_t>());
        DKI_CUDA_LAUNCHED();
        DKI_CUDA_CHECK(cudaMemcpyAsync(pinned, lane.dev[slot].get(), n, cudaMemcpyDeviceToHost, s));
      }
      DKI_CUDA_CHECK(cudaEventRecord(lane.done[slot], s));
      // The chunk before this one is copied out while this one is in flight; its slot is then
      // free for the chunk after this one.
      if (behind) copy_out(*behind);
      behind = InFlight{sec.host + at, slot, n};
    });
    if (behind) copy_out(*behind);
  });
}

// The sections of a `storage` payload of a block with n elements per tensor and these shapes,
// holding device tensors k and v. Int8 payloads are [key scales][key int8][value scales]
// [value int8]; their scales sit in the lane's buffer (grown here as needed).
std::vector<Section> payload_sections(StagingLane& lane, const KVBlock& shape, KVStorage storage, unsigned char* payload, float* k, float* v) {
  const size_t n = shape.elements();
  switch (storage) {
    case KVStorage::F32:
      return {{Section::Bytes, payload, n * 4, k}, {Section::Bytes, payload + n * 4, n * 4, v}};
    case KVStorage::F16:
    case KVStorage::BF16:
      return {{Section::Half, payload, n * 2, k}, {Section::Half, payload + n * 2, n * 2, v}};
    case KVStorage::Int8:
      break;
  }
  const size_t kscales = size_t(shape.n_layers) * shape.n_kv_heads * shape.head_dim;
  const size_t vscales = size_t(shape.n_layers) * shape.n_kv_heads * shape.n_tokens;
  if (lane.scales.bytes() < (kscales + vscales) * sizeof(float)) lane.scales.allocate((kscales + vscales) * sizeof(float), "int8 K/V scales");
  float* ks = lane.scales.get<float>();
  float* vs = ks + kscales;
  unsigned char* p = payload;
  return {{Section::Bytes, p, kscales * 4, ks},
          {Section::Int8, p + kscales * 4, n, k, ks, true},
          {Section::Bytes, p + kscales * 4 + n, vscales * 4, vs},
          {Section::Int8, p + kscales * 4 + n + vscales * 4, n, v, vs, false}};
}

}  // namespace

void cuda_encode_payload(const KVBlock& b, KVStorage storage, unsigned char* out) {
  const DeviceKV& d = *b.device;
  LockedLane locked(d.device);
  StagingLane& lane = locked.lane;
  float *k = d.k.get<float>(), *v = d.v.get<float>();
  const std::vector<Section> sections = payload_sections(lane, b, storage, out, k, v);
  if (storage == KVStorage::Int8) {
    // The scales first: each needs its whole channel (keys) or row (values).
    const int LH = b.n_layers * b.n_kv_heads;
    const size_t kscales = size_t(LH) * b.head_dim, vscales = size_t(LH) * b.n_tokens;
    key_scales_kernel<<<grid_for(kscales), kThreads, 0, lane.stream>>>(k, LH, b.n_tokens, b.head_dim, lane.scales.get<float>());
    DKI_CUDA_LAUNCHED();
    value_scales_kernel<<<grid_for(vscales), kThreads, 0, lane.stream>>>(v, vscales, b.head_dim, lane.scales.get<float>() + kscales);
    DKI_CUDA_LAUNCHED();
  }
  download(lane, sections, storage, b.n_tokens, b.head_dim);
}

std::shared_ptr<const DeviceKV> cuda_decode_payload(const KVBlock& shape, KVStorage storage, const unsigned char* payload, int device,
                                                    Checksum64& hash) {
  LockedLane locked(device);
  auto d = std::make_shared<DeviceKV>(device, shape.elements());
  // upload() only reads the payload.
  const auto sections = payload_sections(locked.lane, shape, storage, const_cast<unsigned char*>(payload), d->k.get<float>(), d->v.get<float>());
  upload(locked.lane, sections, storage, shape.n_tokens, shape.head_dim, &hash);
  return d;
}

void upload_rows(int device, const void* host, size_t width, size_t rows, void* dst, size_t pitch) {
  if (width == 0 || rows == 0) return;
  LockedLane locked(device);
  // upload() only reads the host rows.
  Section rows_at{Section::Bytes, static_cast<unsigned char*>(const_cast<void*>(host)), width * rows, dst};
  rows_at.width = width, rows_at.pitch = pitch;
  upload(locked.lane, {rows_at}, KVStorage::F32, 0, 0, nullptr);
}

namespace {
struct DevicePools {
  std::mutex mutex;
  std::map<int, BufferPool*> pools;  // never destroyed, like the staging lanes
  size_t cap = size_t(256) << 20;
};
DevicePools& device_pools() {
  static DevicePools* p = new DevicePools;
  return *p;
}
}  // namespace

BufferPool& device_block_pool(int device) {
  DevicePools& d = device_pools();
  std::lock_guard<std::mutex> lock(d.mutex);
  BufferPool*& pool = d.pools[device];
  if (!pool) {
    // A block may be dropped on any thread, whatever device that thread is on.
    pool = new BufferPool(
        [device](void* p) {
          int current = -1;
          cudaGetDevice(&current);
          cudaSetDevice(device);
          cudaFree(p);
          if (current >= 0 && current != device) cudaSetDevice(current);
        },
        d.cap);
  }
  return *pool;
}

// Freeing runs outside DevicePools::mutex: cudaFree waits for the whole device, and every new
// block on every GPU takes that mutex. Pools are never destroyed, so the pointers stay valid.
void cuda_set_pool_bytes(size_t bytes) {
  DevicePools& d = device_pools();
  std::vector<BufferPool*> pools;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.cap = bytes;
    for (auto& [device, pool] : d.pools) pools.push_back(pool);
  }
  for (BufferPool* pool : pools) pool->set_cap(bytes);
}

bool drain_device_block_pool(int device) {
  DevicePools& d = device_pools();
  BufferPool* pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    const auto it = d.pools.find(device);
    if (it != d.pools.end()) pool = it->second;
  }
  if (!pool || pool->held() == 0) return false;
  pool->drain();
  return true;
}

size_t cuda_pool_bytes(int device) {
  DevicePools& d = device_pools();
  std::lock_guard<std::mutex> lock(d.mutex);
  const auto it = d.pools.find(device);
  return it == d.pools.end() ? 0 : it->second->held();
}

int device_kv_device(const DeviceKV& d) { return d.device; }
uint64_t device_kv_bytes(const DeviceKV& d) { return d.k.bytes() + d.v.bytes(); }

std::shared_ptr<const KVBlock> cuda_block_to_device(std::shared_ptr<const KVBlock> b, int device) {
  if (b->device && b->device->device == device) return b;
  check_device(device);
  const size_t n = b->elements(), bytes = n * sizeof(float);
  auto out = same_header(*b);
  if (b->device) {  // on another GPU
    auto d = std::make_shared<DeviceKV>(device, n);
    CopyStream s(device);
    DKI_CUDA_CHECK(cudaMemcpyPeerAsync(d->k.get(), device, b->device->k.get(), b->device->device, bytes, s.get()));
    DKI_CUDA_CHECK(cudaMemcpyPeerAsync(d->v.get(), device, b->device->v.get(), b->device->device, bytes, s.get()));
    s.wait();
    out->device = std::move(d);
  } else {
    // upload() only reads them.
    auto* k = reinterpret_cast<unsigned char*>(const_cast<float*>(host_kv(*b, "toDevice").k.data()));
    auto* v = reinterpret_cast<unsigned char*>(const_cast<float*>(b->v.data()));
    LockedLane locked(device);
    auto d = std::make_shared<DeviceKV>(device, n);
    upload(locked.lane, {{Section::Bytes, k, bytes, d->k.get()}, {Section::Bytes, v, bytes, d->v.get()}}, KVStorage::F32, 0, 0, nullptr);
    out->device = std::move(d);
  }
  return out;
}

std::shared_ptr<const KVBlock> cuda_block_to_host(std::shared_ptr<const KVBlock> b) {
  if (!b->device) return b;
  const DeviceKV& d = *b->device;
  auto out = same_header(*b);
  out->k.resize(d.elements);
  out->v.resize(d.elements);
  const size_t bytes = d.elements * sizeof(float);
  LockedLane locked(d.device);
  download(locked.lane,
           {{Section::Bytes, reinterpret_cast<unsigned char*>(out->k.data()), bytes, d.k.get()},
            {Section::Bytes, reinterpret_cast<unsigned char*>(out->v.data()), bytes, d.v.get()}},
           KVStorage::F32, 0, 0);
  return out;
}

}  // namespace dki

namespace dki {

std::shared_ptr<const KVBlock> cuda_scale_values(const KVBlock& b, float alpha) {
  auto out = device_like(b, b.n_tokens);
  CopyStream s(b.device->device);
  out->tokens = b.tokens;
  const size_t bytes = b.elements() * sizeof(float);
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->device->k.get(), b.device->k.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
  DKI_CUDA_CHECK(cudaMemcpyAsync(out->device->v.get(), b.device->v.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
  launch_scale(out->device->v.get<float>(), alpha, b.elements(), s.get());
  s.wait();
  if (cuda_block_abs_max(*out, false) == INFINITY) throw_scaled_overflow(alpha, cuda_block_abs_max(b, false));
  return out;
}

float cuda_block_abs_max(const KVBlock& b, bool keys) {
  CopyStream s(b.device->device);
  DeviceBuffer bits(sizeof(unsigned), "a block's largest value");
  launch_absmax_bits(keys ? b.device->k.get<float>() : b.device->v.get<float>(), b.elements(), bits.get<unsigned>(), s.get());
  unsigned h = 0;
  DKI_CUDA_CHECK(cudaMemcpyAsync(&h, bits.get(), sizeof h, cudaMemcpyDeviceToHost, s.get()));
  s.wait();
  if (h >= 0x7f800000u) return INFINITY;
  float f;
  std::memcpy(&f, &h, sizeof f);
  return f;
}

std::shared_ptr<const KVBlock> cuda_remap_positions(const KVBlock& b, int new_start, const std::vector<double>& inv_freq, bool interleaved) {
  auto out = device_like(b, b.n_tokens);
  CopyStream s(b.device->device);
  out->tokens = b.tokens;
  out->start_pos = new_start;
  copy_tokens(b, 0, b.n_tokens, *out, 0, s.get());
  rotate_keys(*out, new_start - b.start_pos, inv_freq, interleaved, s.get());
  s.wait();
  return out;
}

std::shared_ptr<const KVBlock> cuda_slice_block(const KVBlock& b, int from, int to) {
  auto out = device_like(b, to - from);
  CopyStream s(b.device->device);
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
  auto out = device_like(first, total);
  CopyStream s(first.device->device);
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
