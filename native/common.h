// Shared definitions of the native engine: element types, errors and scalar conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace dki {

// Every failure the engine reports to JS is a dki::Error; the binding turns it into a JS Error.
struct Error : std::runtime_error {
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A failed system call; code names its errno ("EWOULDBLOCK", "ENOLCK", …) for JS callers, or is
// empty for an errno they are not expected to tell apart.
struct SystemError : Error {
  SystemError(const std::string& msg, std::string code) : Error(msg), code(std::move(code)) {}
  std::string code;
};

// Q8_0 is llama.cpp's block_q8_0: per 32 weights, an fp16 scale d then 32 int8 q (w = d·q).
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

constexpr int kQ8Block = 32;
constexpr int kQ8BlockBytes = 34;

// Bytes of `n` consecutive elements (n a multiple of 32 for Q8_0).
inline uint64_t dtype_bytes(DType t, uint64_t n) {
  switch (t) {
    case DType::F32: return n * 4;
    case DType::Q8_0: return n / kQ8Block * kQ8BlockBytes;
    default: return n * 2;
  }
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return "Q8_0";
  }
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // keep NaN a NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return uint16_t(bits >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; exp--; }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);     // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);    // overflow → inf (rounds past 65504)
  if (absx < 0x38800000u) {                                    // subnormal or zero in f16
    if (absx < 0x33000000u) return uint16_t(sign);             // below half the smallest subnormal
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (112 - e) ... maps to the 10-bit subnormal mantissa
    uint32_t mant = m >> (shift);
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (mant & 1u))) mant++;
    return uint16_t(sign | mant);
  }
  uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u);  // round to nearest even at bit 13
  return uint16_t(sign | ((r - 0x38000000u) >> 13));
}

inline float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::Q8_0: {
      const unsigned char* block = static_cast<const unsigned char*>(p) + (i / kQ8Block) * kQ8BlockBytes;
      uint16_t d;
      std::memcpy(&d, block, 2);
      return f16_to_f32(d) * float(int8_t(block[2 + i % kQ8Block]));
    }
    default: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

}  // namespace dki
