// The 64-bit checksum of serialised K/V blocks (fast, not cryptographic), computable in pieces:
// a restore onto the GPU hashes each chunk as it copies it into pinned staging memory, so the
// payload is read once for both. Feeding the same bytes in any split gives the same digest.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dki {

class Checksum64 {
 public:
  void update(const unsigned char* data, size_t n) { consume<false>(data, nullptr, n); }
  // update(src, n) that also copies src to dst.
  void update_copy(const unsigned char* src, unsigned char* dst, size_t n) { consume<true>(src, dst, n); }

  uint64_t digest() const {
    uint64_t h = total_;
    for (int j = 0; j < 4; j++) h = (h ^ lanes_[j]) * kMul, h ^= h >> 32;
    for (size_t i = 0; i < pending_n_; i++) h = (h ^ pending_[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }

 private:
  // Four independent multiply-xorshift lanes over 8-byte words: several GB/s, and any single
  // flipped bit changes the result. Bytes past the last whole 32-byte word wait in pending_.
  static constexpr uint64_t kMul = 0x9fb21c651e98df25ull;
  uint64_t lanes_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  unsigned char pending_[32];
  size_t pending_n_ = 0;
  uint64_t total_ = 0;

  static void mix(uint64_t (&lanes)[4], const unsigned char* word) {
    for (int j = 0; j < 4; j++) {
      uint64_t w;
      std::memcpy(&w, word + 8 * j, 8);
      lanes[j] = (lanes[j] ^ w) * kMul;
      lanes[j] ^= lanes[j] >> 29;
    }
  }

  template <bool kCopy>
  void consume(const unsigned char* src, unsigned char* dst, size_t n) {
    if (n == 0) return;  // src may be null (an empty vector's data())
    total_ += n;
    size_t i = 0;
    if (pending_n_ > 0) {
      i = n < 32 - pending_n_ ? n : 32 - pending_n_;
      std::memcpy(pending_ + pending_n_, src, i);
      if constexpr (kCopy) std::memcpy(dst, src, i);
      pending_n_ += i;
      if (pending_n_ < 32) return;
      mix(lanes_, pending_);
      pending_n_ = 0;
    }
    // Locals, not the members: stores through dst (a char pointer) could alias them and force a
    // reload of every lane each word.
    uint64_t lanes[4] = {lanes_[0], lanes_[1], lanes_[2], lanes_[3]};
    for (; i + 32 <= n; i += 32) {
      if constexpr (kCopy) std::memcpy(dst + i, src + i, 32);
      mix(lanes, src + i);
    }
    std::memcpy(lanes_, lanes, sizeof lanes);
    pending_n_ = n - i;
    std::memcpy(pending_, src + i, pending_n_);
    if constexpr (kCopy) std::memcpy(dst + i, src + i, pending_n_);
  }
};

inline uint64_t checksum64(const unsigned char* data, size_t size) {
  Checksum64 c;
  c.update(data, size);
  return c.digest();
}

}  // namespace dki
