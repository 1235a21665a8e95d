#include "kv_ops.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common.h"
#include "kernels/kernels.h"
#include "model.h"
#include "resources.h"
#include "threadpool.h"
#ifdef DKI_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dki {

namespace {

std::shared_ptr<KVBlock> like(const KVBlock& b, int n_tokens) {
  auto out = std::make_shared<KVBlock>();
  out->n_layers = b.n_layers;
  out->n_kv_heads = b.n_kv_heads;
  out->head_dim = b.head_dim;
  out->n_tokens = n_tokens;
  out->start_pos = b.start_pos;
  out->fingerprint = b.fingerprint;
  out->k.resize(size_t(b.n_layers) * out->layer_stride());
  out->v.resize(out->k.size());
  return out;
}

// A host-memory copy of b to change: derived blocks never carry b's device copy along.
std::shared_ptr<KVBlock> host_copy(const KVBlock& b, const char* op) {
  auto out = std::make_shared<KVBlock>(host_kv(b, op));
  out->device.reset();
  return out;
}

// Rotate every key of rows [0, n) of each (layer, head) by `delta` positions, in place.
void rotate_keys(KVBlock& b, int delta, const std::vector<double>& inv_freq, bool interleaved) {
  if (delta == 0) return;
  const int hd = b.head_dim;
  const std::vector<float> cs = rotation_by(delta, inv_freq);
  const size_t rows = size_t(b.n_layers) * b.n_kv_heads * b.n_tokens;
  for (size_t r = 0; r < rows; r++) rotate_pairs(b.k.data() + r * hd, hd, cs.data(), cs.data() + hd / 2, interleaved);
}

// Copies tokens [from, from+n) of src into tokens [at, at+n) of dst, every layer and head.
void copy_tokens(const KVBlock& src, int from, int n, KVBlock& dst, int at) {
  const int hd = src.head_dim;
  for (int l = 0; l < src.n_layers; l++)
    for (int h = 0; h < src.n_kv_heads; h++) {
      const size_t s = ((size_t(l) * src.n_kv_heads + h) * src.n_tokens + from) * hd;
      const size_t d = ((size_t(l) * dst.n_kv_heads + h) * dst.n_tokens + at) * hd;
      std::copy_n(&src.k[s], size_t(n) * hd, &dst.k[d]);
      std::copy_n(&src.v[s], size_t(n) * hd, &dst.v[d]);
    }
}

// ---- serialisation

constexpr char kMagic[8] = {'D', 'K', 'I', 'K', 'V', 'B', 'L', 'K'};
constexpr uint32_t kVersion = 2;

#pragma pack(push, 1)
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t storage;
  int32_t n_layers, n_kv_heads, head_dim, n_tokens;
  int32_t start_pos;
  uint32_t reserved;
  uint64_t fingerprint;
  uint64_t body_bytes;  // token ids + payload
  uint64_t checksum;    // of the header (this field zeroed) and the body
};
#pragma pack(pop)
static_assert(sizeof(Header) == 64, "header layout");

// Limits that keep a lying header from asking for absurd allocations: the model shapes the
// engine takes.
constexpr int32_t kMaxLayers = limits::kLayers, kMaxHeads = limits::kHeads, kMaxHeadDim = limits::kHeadDim, kMaxTokens = kMaxBlockTokens;

size_t elements(const KVBlock& b) { return size_t(b.n_layers) * b.n_kv_heads * b.n_tokens * b.head_dim; }

size_t payload_bytes(int L, int H, int T, int hd, KVStorage s) {
  const size_t n = size_t(L) * H * T * hd;
  switch (s) {
    case KVStorage::F32: return 2 * n * 4;
    case KVStorage::F16:
    case KVStorage::BF16: return 2 * n * 2;
    case KVStorage::Int8: return 2 * n + size_t(L) * H * hd * 4 + size_t(L) * H * T * 4;
  }
  return 0;
}

template <typename T>
void put(std::vector<unsigned char>& out, size_t& at, const T& v) {
  std::memcpy(out.data() + at, &v, sizeof v);
  at += sizeof v;
}

template <typename T>
T get(const unsigned char* p, size_t& at) {
  T v;
  std::memcpy(&v, p + at, sizeof v);
  at += sizeof v;
  return v;
}

}  // namespace

BlockPtr scale_values(const KVBlock& b, float alpha) {
  if (!std::isfinite(alpha)) throw Error("alpha must be a finite number");
#ifdef DKI_CUDA
  if (b.device) return cuda_scale_values(b, alpha);
#endif
  auto out = host_copy(b, "scaleValues");
  for (float& v : out->v) v *= alpha;
  if (abs_max(out->v.data(), out->v.size()) == INFINITY) throw_scaled_overflow(alpha, abs_max(b.v.data(), b.v.size()));
  return out;
}

float known_value_abs_max(const KVBlock& b) {
  float m = b.value_abs_max.v.load(std::memory_order_acquire);
  if (m >= 0) return m;
  // A key that is not finite makes the block unusable as a whole: it enters as +inf.
  if (b.on_host()) {
    m = std::max(abs_max(b.k.data(), b.k.size()) == INFINITY ? INFINITY : 0.f, abs_max(b.v.data(), b.v.size()));
  } else {
#ifdef DKI_CUDA
    m = std::max(cuda_block_abs_max(b, true) == INFINITY ? INFINITY : 0.f, cuda_block_abs_max(b, false));
#else
    throw Error("internal: a K/V block with no tensors in host memory in a build without CUDA");
#endif
  }
  b.value_abs_max.v.store(m, std::memory_order_release);
  return m;
}

BlockPtr remap_positions(const KVBlock& b, int new_start, const std::vector<double>& inv_freq, bool interleaved) {
  if (int(inv_freq.size()) * 2 != b.head_dim) throw Error("block head_dim does not match the model");
  if (new_start < -kMaxPosition || new_start > kMaxPosition)
    throw Error("remap: start position " + std::to_string(new_start) + " is outside ±" + std::to_string(kMaxPosition));
  // A remap moves keys and copies values: the copy's largest value is the source's. Known on the
  // source (scanned once), a block remapped afresh for every call (a GPU injection) is not
  // scanned again each time it is injected.
  const float vmax = known_value_abs_max(b);
  BlockPtr out;
#ifdef DKI_CUDA
  if (b.device) out = cuda_remap_positions(b, new_start, inv_freq, interleaved);
#endif
  if (!out) {
    auto host = host_copy(b, "remap");
    rotate_keys(*host, new_start - b.start_pos, inv_freq, interleaved);
    host->start_pos = new_start;
    out = host;
  }
  out->value_abs_max.v.store(vmax, std::memory_order_release);
  return out;
}

BlockPtr concat_blocks(const std::vector<BlockPtr>& blocks, const std::vector<double>& inv_freq, bool interleaved, std::optional<int> start) {
  if (blocks.empty()) throw Error("concat needs at least one block");
  const KVBlock& first = *blocks[0];
  int64_t total = 0;
  for (const auto& b : blocks) {
    if (b->fingerprint != first.fingerprint) throw Error("cannot concat blocks computed by different models");
    if (b->n_layers != first.n_layers || b->n_kv_heads != first.n_kv_heads || b->head_dim != first.head_dim)
      throw Error("cannot concat blocks of different shapes");
    if (!first.device) host_kv(*b, "concat");
    total += b->n_tokens;
  }
  if (total > kMaxTokens) throw Error("concatenated block would exceed " + std::to_string(kMaxTokens) + " tokens");
  const int64_t from = start.value_or(first.start_pos);
  if (from < -kMaxPosition || from + total > kMaxPosition)
    throw Error("concat: positions " + std::to_string(from) + ".." + std::to_string(from + total - 1) + " are outside ±" + std::to_string(kMaxPosition));
#ifdef DKI_CUDA
  if (first.device) {
    if (from == first.start_pos) return cuda_concat_blocks(blocks, int(total), inv_freq, interleaved);
    std::vector<BlockPtr> moved = blocks;
    moved[0] = cuda_remap_positions(first, int(from), inv_freq, interleaved);
    return cuda_concat_blocks(moved, int(total), inv_freq, interleaved);
  }
#endif
  // Each block's keys are copied, then turned by the distance to where they land: one copy of each
  // block, not a moved copy of it first (DKISystem coalesces a turn's memory blocks with this).
  auto out = like(first, int(total));
  out->start_pos = int(from);
  const int hd = first.head_dim;
  int at = 0;
  for (const auto& b : blocks) {
    copy_tokens(*b, 0, b->n_tokens, *out, at);
    const int64_t delta = from + at - b->start_pos;
    if (delta != 0) {
      const std::vector<float> cs = rotation_by(delta, inv_freq);
      for (int l = 0; l < out->n_layers; l++)
        for (int h = 0; h < out->n_kv_heads; h++) {
          float* rows = out->k.data() + ((size_t(l) * out->n_kv_heads + h) * size_t(total) + at) * hd;
          for (int t = 0; t < b->n_tokens; t++) rotate_pairs(rows + size_t(t) * hd, hd, cs.data(), cs.data() + hd / 2, interleaved);
        }
    }
    out->tokens.insert(out->tokens.end(), b->tokens.begin(), b->tokens.end());
    at += b->n_tokens;
  }
  return out;
}

BlockPtr slice_block(const KVBlock& b, int from, int to) {
  check_token_range("slice", from, to, b.n_tokens, "the block's");
#ifdef DKI_CUDA
  if (b.device) return cuda_slice_block(b, from, to);
#endif
  host_kv(b, "slice");
  auto out = like(b, to - from);
  copy_tokens(b, from, to - from, *out, 0);
  out->start_pos = b.start_pos + from;
  out->tokens.assign(b.tokens.begin() + from, b.tokens.begin() + to);
  return out;
}

KVStorage parse_storage(const std::string& name) {
  if (name == "f32" || name == "fp32") return KVStorage::F32;
  if (name == "f16" || name == "fp16") return KVStorage::F16;
  if (name == "bf16") return KVStorage::BF16;
  if (name == "int8" || name == "q8") return KVStorage::Int8;
  throw Error("unknown K/V storage \"" + name + "\" (expected f32, f16, bf16 or int8)");
}

size_t storage_bytes(const KVBlock& b, KVStorage storage) {
  return payload_bytes(b.n_layers, b.n_kv_heads, b.n_tokens, b.head_dim, storage);
}

size_t serialized_bytes(const KVBlock& b, KVStorage storage) {
  return sizeof(Header) + size_t(b.n_tokens) * 4 + storage_bytes(b, storage);
}

namespace {
// A block's checksum from those of its header (checksum field zeroed) and its body.
uint64_t block_checksum(uint64_t head, uint64_t body) {
  uint64_t h = head * 0x9fb21c651e98df25ull;
  h ^= body;
  h ^= h >> 31;
  return h;
}

// Half-precision conversion of a whole block, split over the thread pool: it is bandwidth-bound,
// one core does not saturate the memory system, and a fresh buffer's page faults are taken by
// both cores at once.
template <class Src, class Dst>
void convert_parallel(void (*fn)(const Src*, Dst*, size_t), const Src* src, Dst* dst, size_t n) {
  constexpr size_t kChunk = size_t(1) << 16;  // elements: a few pages, so chunks never share one
  if (n < 4 * kChunk) return fn(src, dst, n);
  const int chunks = int((n + kChunk - 1) / kChunk);
  thread_pool().parallel_for(chunks, 1, [&](int c0, int c1) {
    const size_t b = size_t(c0) * kChunk, e = std::min(n, size_t(c1) * kChunk);
    fn(src + b, dst + b, e - b);
  });
}
}  // namespace

namespace {

// The payload of a host block in `storage` form, at dst (payload_bytes long, any alignment).
void encode_payload(const KVBlock& b, KVStorage storage, unsigned char* dst) {
  const size_t n = elements(b);
  switch (storage) {
    case KVStorage::F32:
      std::memcpy(dst, b.k.data(), n * 4);
      std::memcpy(dst + n * 4, b.v.data(), n * 4);
      return;
    case KVStorage::F16:
    case KVStorage::BF16: {
      // Converted into an aligned buffer, then copied: dst need not be 2-byte aligned.
      std::vector<uint16_t> half(2 * n);
      const auto convert = storage == KVStorage::F16 ? kernels().f32_to_f16 : kernels().f32_to_bf16;
      convert_parallel(convert, b.k.data(), half.data(), n);
      convert_parallel(convert, b.v.data(), half.data() + n, n);
      std::memcpy(dst, half.data(), 4 * n);
      return;
    }
    case KVStorage::Int8: {
      // Keys: one scale per (layer, head, channel) over all tokens — key outliers live in fixed
      // channels. Values: one scale per (layer, head, token) over its channels.
      // (cuda/device_kv.cu computes the same bytes on a GPU.)
      const int L = b.n_layers, H = b.n_kv_heads, T = b.n_tokens, hd = b.head_dim;
      std::vector<float> kscale(size_t(L) * H * hd, 0.f), vscale(size_t(L) * H * T, 0.f);
      for (int lh = 0; lh < L * H; lh++)
        for (int t = 0; t < T; t++)
          for (int c = 0; c < hd; c++) {
            float& s = kscale[size_t(lh) * hd + c];
            s = std::max(s, std::fabs(b.k[(size_t(lh) * T + t) * hd + c]));
          }
      for (float& s : kscale) s /= 127.f;
      for (size_t r = 0; r < size_t(L) * H * T; r++) {
        float m = 0;
        for (int c = 0; c < hd; c++) m = std::max(m, std::fabs(b.v[r * hd + c]));
        vscale[r] = m / 127.f;
      }
      const auto quantize = [](float x, float s) { return s > 0 ? int8_t(std::clamp(std::nearbyint(x / s), -127.f, 127.f)) : int8_t(0); };
      std::memcpy(dst, kscale.data(), kscale.size() * 4);
      dst += kscale.size() * 4;
      for (int lh = 0; lh < L * H; lh++)
        for (int t = 0; t < T; t++)
          for (int c = 0; c < hd; c++) *dst++ = static_cast<unsigned char>(quantize(b.k[(size_t(lh) * T + t) * hd + c], kscale[size_t(lh) * hd + c]));
      std::memcpy(dst, vscale.data(), vscale.size() * 4);
      dst += vscale.size() * 4;
      for (size_t r = 0; r < size_t(L) * H * T; r++)
        for (int c = 0; c < hd; c++) *dst++ = static_cast<unsigned char>(quantize(b.v[r * hd + c], vscale[r]));
      return;
    }
  }
}

// The inverse into b's (sized) host tensors; src is payload_bytes long, any alignment.
void decode_payload(KVBlock& b, KVStorage storage, const unsigned char* src) {
  const size_t n = elements(b);
  switch (storage) {
    case KVStorage::F32:
      std::memcpy(b.k.data(), src, n * 4);
      std::memcpy(b.v.data(), src + n * 4, n * 4);
      return;
    case KVStorage::F16:
    case KVStorage::BF16: {
      // The payload starts at an even offset (64-byte header + 4 bytes per token id), but the
      // caller's buffer may not be 2-byte aligned: convert from an aligned copy if it is not.
      std::vector<uint16_t> aligned;
      if (reinterpret_cast<uintptr_t>(src) % 2 != 0) {
        aligned.resize(2 * n);
        std::memcpy(aligned.data(), src, 4 * n);
        src = reinterpret_cast<const unsigned char*>(aligned.data());
      }
      const uint16_t* half = reinterpret_cast<const uint16_t*>(src);
      const auto convert = storage == KVStorage::F16 ? kernels().f16_to_f32 : kernels().bf16_to_f32;
      convert_parallel(convert, half, b.k.data(), n);
      convert_parallel(convert, half + n, b.v.data(), n);
      return;
    }
    case KVStorage::Int8: {
      const int L = b.n_layers, H = b.n_kv_heads, T = b.n_tokens, hd = b.head_dim;
      size_t at = 0;
      std::vector<float> kscale(size_t(L) * H * hd);
      for (float& s : kscale) s = get<float>(src, at);
      for (int lh = 0; lh < L * H; lh++)
        for (int t = 0; t < T; t++)
          for (int c = 0; c < hd; c++) b.k[(size_t(lh) * T + t) * hd + c] = float(int8_t(src[at++])) * kscale[size_t(lh) * hd + c];
      std::vector<float> vscale(size_t(L) * H * T);
      for (float& s : vscale) s = get<float>(src, at);
      for (size_t r = 0; r < size_t(L) * H * T; r++)
        for (int c = 0; c < hd; c++) b.v[r * hd + c] = float(int8_t(src[at++])) * vscale[r];
      return;
    }
  }
}

// F16 ends at 65504: a key or value of magnitude 65520 or more (outlier channels and α-scaled
// values can be) rounds to inf and would poison every attention score it meets once restored.
// Such a block, or one holding a NaN, is refused in f16 rather than stored broken; bf16 and int8
// take any finite value.
void check_f16_range(const KVBlock& b, const unsigned char* half) {
  const size_t n = elements(b);
  const auto inf_or_nan = [&](size_t i) {
    uint16_t h;
    std::memcpy(&h, half + 2 * i, 2);
    return (h & 0x7c00) == 0x7c00;
  };
  bool any = false;
  for (size_t i = 0; i < 2 * n; i++) any |= inf_or_nan(i);  // no early exit: this loop vectorises
  if (!any) return;
  size_t i = 0;
  while (!inf_or_nan(i)) i++;
  const char* tensor = i < n ? "key" : "value";
  const size_t layer = (i % n) / b.layer_stride();
  throw Error(std::string("cannot store this K/V block as f16: a ") + tensor + " in layer " + std::to_string(layer) +
              " is beyond f16's range (it rounds to ±inf past ±65504) or not a number; store it as bf16, int8 or f32");
}

}  // namespace

std::vector<unsigned char> serialize_block(const KVBlock& b, KVStorage storage) {
  std::vector<unsigned char> out(serialized_bytes(b, storage));
  const size_t body = out.size() - sizeof(Header);
  size_t at = sizeof(Header);
  for (int32_t t : b.tokens) put(out, at, t);
#ifdef DKI_CUDA
  if (b.device)  // quantised or converted on the GPU: only the stored bytes cross PCIe
    cuda_encode_payload(b, storage, out.data() + at);
  else
#endif
    encode_payload(host_kv(b, "serialize"), storage, out.data() + at);
  if (storage == KVStorage::F16) check_f16_range(b, out.data() + at);
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.storage = uint32_t(storage);
  h.n_layers = b.n_layers;
  h.n_kv_heads = b.n_kv_heads;
  h.head_dim = b.head_dim;
  h.n_tokens = b.n_tokens;
  h.start_pos = b.start_pos;
  h.fingerprint = b.fingerprint;
  h.body_bytes = body;
  h.checksum = 0;
  h.checksum = block_checksum(checksum64(reinterpret_cast<const unsigned char*>(&h), sizeof h), checksum64(out.data() + sizeof(Header), body));
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

BlockPtr deserialize_block(const unsigned char* data, size_t size, uint64_t expected_fingerprint, int device) {
  if (size < sizeof(Header)) throw Error("K/V block data is " + std::to_string(size) + " bytes, shorter than its 64-byte header");
  Header h;
  std::memcpy(&h, data, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw Error("not a K/V block (bad magic)");
  if (h.version != kVersion) throw Error("K/V block format version " + std::to_string(h.version) + " is not supported (expected " + std::to_string(kVersion) + ")");
  if (h.storage > uint32_t(KVStorage::Int8)) throw Error("K/V block has unknown storage type " + std::to_string(h.storage));
  auto in_range = [](int32_t v, int32_t max) { return v > 0 && v <= max; };
  if (!in_range(h.n_layers, kMaxLayers) || !in_range(h.n_kv_heads, kMaxHeads) || !in_range(h.head_dim, kMaxHeadDim) || !in_range(h.n_tokens, kMaxTokens) ||
      h.head_dim % 2 != 0)
    throw Error("K/V block header has invalid dimensions");
  if (h.start_pos < -kMaxPosition || h.start_pos > kMaxPosition)
    throw Error("K/V block header has start position " + std::to_string(h.start_pos) + ", outside ±" + std::to_string(kMaxPosition));
  const KVStorage storage = KVStorage(h.storage);
  const size_t body = size_t(h.n_tokens) * 4 + payload_bytes(h.n_layers, h.n_kv_heads, h.n_tokens, h.head_dim, storage);
  if (h.body_bytes != body) throw Error("K/V block header says " + std::to_string(h.body_bytes) + " body bytes, its dimensions need " + std::to_string(body));
  if (size - sizeof(Header) < body) throw Error("K/V block is truncated: " + std::to_string(size) + " bytes, expected " + std::to_string(sizeof(Header) + body));
  if (size - sizeof(Header) > body) throw Error("K/V block has " + std::to_string(size - sizeof(Header) - body) + " trailing bytes");
  auto b = std::make_shared<KVBlock>();
  b->n_layers = h.n_layers;
  b->n_kv_heads = h.n_kv_heads;
  b->head_dim = h.head_dim;
  b->n_tokens = h.n_tokens;
  b->start_pos = h.start_pos;
  b->fingerprint = h.fingerprint;
  size_t at = sizeof(Header);
  b->tokens.resize(h.n_tokens);
  for (auto& t : b->tokens) t = get<int32_t>(data, at);
  const unsigned char* payload = data + at;

  // The checksum covers the header too (a flipped start position or fingerprint is corruption):
  // a copy of the header with the checksum field zeroed, then the body (token ids, payload) in
  // place. A restore onto a GPU hashes the payload as it stages it for upload (one read of it);
  // its device block is dropped below, before anyone sees it, when the sum is wrong.
  Header zeroed = h;
  zeroed.checksum = 0;
  Checksum64 body_hash;
  body_hash.update(data + sizeof(Header), size_t(h.n_tokens) * 4);
  if (device >= 0) {
#ifdef DKI_CUDA
    b->device = cuda_decode_payload(*b, storage, payload, device, body_hash);
#else
    throw Error("this addon was built without CUDA: a K/V block cannot be restored into GPU memory");
#endif
  } else {
    body_hash.update(payload, body - size_t(h.n_tokens) * 4);
  }
  if (block_checksum(checksum64(reinterpret_cast<const unsigned char*>(&zeroed), sizeof zeroed), body_hash.digest()) != h.checksum)
    throw Error("K/V block checksum mismatch (corrupt data)");
  if (expected_fingerprint != 0 && h.fingerprint != expected_fingerprint) throw Error("K/V block was computed by another model (fingerprint mismatch)");
  if (b->device) return b;

  b->k.resize(b->elements());
  b->v.resize(b->elements());
  decode_payload(*b, storage, payload);
  return b;
}

}  // namespace dki
