// A K/V block: every layer's keys and values for a run of tokens, the unit of DKI memory.
#pragma once
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace dki {

// K and V of a block in one GPU's memory (cuda/cuda_backend.h). Only DKI_CUDA builds make one;
// elsewhere a block's `device` is always null.
struct DeviceKV;

// Storage of K/V blocks, which are big (46 KB per token at the 135M shape) and often made only
// to be overwritten at once (restored from a cache tier, exported from a context):
// - resize() leaves new elements uninitialised instead of writing zeros first;
// - buffers of 256 KiB or more are recycled through a bounded pool (kv_buffer.cpp), so restoring
//   a block into memory a freed block used costs no page faults at all; from 2 MiB up they are
//   2 MiB-aligned and offered to transparent huge pages.
void* kv_buffer_alloc(size_t bytes);
void kv_buffer_free(void* p, size_t bytes);
// Bytes of freed buffers kept for reuse (default 256 MiB; 0 returns every buffer to the system).
void set_kv_pool_bytes(size_t bytes);
size_t kv_pool_bytes();

template <class T>
struct KVAllocator {
  using value_type = T;

  KVAllocator() = default;
  template <class U>
  KVAllocator(const KVAllocator<U>&) {}

  T* allocate(size_t n) { return static_cast<T*>(kv_buffer_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { kv_buffer_free(p, n * sizeof(T)); }

  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialise: no zeroing
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const KVAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const KVAllocator<U>&) const { return false; }
};

using KVStore = std::vector<float, KVAllocator<float>>;

// A block's largest |value|, < 0 while not yet known. Atomic: one block may be injected into
// contexts on several threads. A copy starts unknown, since copies are made to be changed
// (host_copy before scaling or remapping).
struct KnownAbsMax {
  std::atomic<float> v{-1.f};
  KnownAbsMax() = default;
  KnownAbsMax(const KnownAbsMax&) {}
  KnownAbsMax& operator=(const KnownAbsMax&) {
    v.store(-1.f);
    return *this;
  }
};

struct KVBlock {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, n_tokens = 0;
  // Position of the first token when its keys were rotated (negative for preference blocks
  // placed before the prompt).
  int start_pos = 0;
  uint64_t fingerprint = 0;  // of the model that computed it
  std::vector<int32_t> tokens;
  // [layer][kv_head][token][head_dim], fp32. Empty when the block lives only in GPU memory.
  KVStore k, v;
  // The same tensors in GPU memory, same layout, instead of k and v; null for a host block. A
  // block never changes residence: toDevice/toHost make new blocks.
  std::shared_ptr<const DeviceKV> device;
  // Filled by the first injection of a host block (Context's segment check), since a block never
  // changes once made: the largest |value| (+inf when a key or value is NaN or ±inf).
  mutable KnownAbsMax value_abs_max;

  size_t elements() const { return size_t(n_layers) * layer_stride(); }
  bool on_host() const { return k.size() == elements(); }
  size_t layer_stride() const { return size_t(n_kv_heads) * n_tokens * head_dim; }
  const float* k_layer(int l) const { return k.data() + l * layer_stride(); }
  const float* v_layer(int l) const { return v.data() + l * layer_stride(); }
};

// A block with b's shape, position, model and tokens, and no tensors yet.
inline std::shared_ptr<KVBlock> same_header(const KVBlock& b) {
  auto out = std::make_shared<KVBlock>();
  out->n_layers = b.n_layers;
  out->n_kv_heads = b.n_kv_heads;
  out->head_dim = b.head_dim;
  out->n_tokens = b.n_tokens;
  out->start_pos = b.start_pos;
  out->fingerprint = b.fingerprint;
  out->tokens = b.tokens;
  return out;
}

// The block itself, after checking that its tensors are in host memory: `op` names what needed
// them in the error a device-only block gets.
inline const KVBlock& host_kv(const KVBlock& b, const char* op) {
  if (!b.on_host())
    throw Error(std::string(op) + ": this K/V block lives only in GPU memory; copy it back with toHost() first");
  return b;
}

// Refuses a token range [from, to) of n tokens that is empty or reaches outside them, saying which
// ("slice [2, 2) is empty", "slice [3, 9) is outside the block's 5 tokens").
inline void check_token_range(const char* what, int from, int to, int n, const char* whose) {
  const std::string range = std::string(what) + " [" + std::to_string(from) + ", " + std::to_string(to) + ")";
  if (from < 0 || to > n) throw Error(range + " is outside " + whose + " " + std::to_string(n) + " tokens");
  if (from >= to) throw Error(range + " is empty: it must hold at least one token (from < to)");
}

// Rotates one head vector by the angles whose cos/sin are given (hd/2 of each). Hugging Face
// pairs dimension i with i + hd/2 ("rotate half"); interleaved layouts pair 2i with 2i+1.
inline void rotate_pairs(float* v, int hd, const float* c, const float* s, bool interleaved) {
  const int half = hd / 2;
  const int stride = interleaved ? 1 : half;  // distance between the two members of a pair
  for (int i = 0; i < half; i++) {
    const int a = interleaved ? 2 * i : i;
    const float x = v[a], y = v[a + stride];
    v[a] = x * c[i] - y * s[i];
    v[a + stride] = y * c[i] + x * s[i];
  }
}

// The angles of a rotation by `delta` positions, as rotate_pairs takes them: cos of each
// delta·inv_freq[i] ([head_dim/2]), then their sines. Rotary angles grow linearly with the
// position, so moving a key by delta (or a query back by it) is this one rotation.
inline std::vector<float> rotation_by(int64_t delta, const std::vector<double>& inv_freq) {
  const size_t half = inv_freq.size();
  std::vector<float> cs(2 * half);
  for (size_t i = 0; i < half; i++) {
    cs[i] = float(std::cos(double(delta) * inv_freq[i]));
    cs[half + i] = float(std::sin(double(delta) * inv_freq[i]));
  }
  return cs;
}

// A block injected into attention: scaling "value" multiplies its V by alpha (keys untouched);
// "logit" adds ln(alpha) to its attention scores instead. temperature divides its scores before
// that (APE's score/T + ln s, with s the logit-scaled alpha); 1 leaves them as they are.
struct Segment {
  std::shared_ptr<const KVBlock> block;
  float alpha = 1.f;
  bool logit_scaling = false;
  float temperature = 1.f;
  // Where the block sits, relative to where it was computed: from start_pos + shift. The CPU
  // attention turns each query back by shift instead of rotating a copy of every key, since for a
  // rotary embedding q·R(Δ)k = (R(−Δ)q)·k. The GPU rotates the keys by shift as it copies the
  // block into its segment buffer (once per new set of blocks and shifts, not per turn).
  int shift = 0;
};

}  // namespace dki
