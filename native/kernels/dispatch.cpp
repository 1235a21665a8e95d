// Picks the kernel table at run time from what the CPU reports, or what DKI_SIMD asks for.
#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels.h"

namespace dki {
namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

bool cpu_has_amx() {
#if defined(__x86_64__)
  return cpu_has_avx512_vnni() && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") && amx_enable();
#else
  return false;
#endif
}

const Kernels* pick(const std::string& name) {
  if (name == "scalar") return &kernels_scalar();
  if (name == "avx2") {
    if (!cpu_has_avx2()) throw Error("SIMD path \"avx2\" is not supported by this CPU (needs AVX2, FMA and F16C)");
    return &kernels_avx2();
  }
  if (name == "avx512") {
    if (!cpu_has_avx512_vnni()) throw Error("SIMD path \"avx512\" is not supported by this CPU (needs AVX-512 F/BW/VL and VNNI)");
    return &kernels_avx512();
  }
  if (name == "amx") {
    if (!cpu_has_amx()) throw Error("SIMD path \"amx\" is not supported by this CPU (needs the avx512 path, AMX-TILE and AMX-INT8, and Linux granting the tile state)");
    return &kernels_amx();
  }
  if (name == "auto" || name.empty())
    return cpu_has_amx() ? &kernels_amx() : cpu_has_avx512_vnni() ? &kernels_avx512() : cpu_has_avx2() ? &kernels_avx2() : &kernels_scalar();
  throw Error("unknown SIMD path \"" + name + "\" (expected auto, scalar, avx2, avx512 or amx)");
}

std::string& env_error() {
  static std::string e;
  return e;
}

// The first use may come from a worker thread, where an exception would end the process: a bad
// DKI_SIMD falls back to auto and leaves its message for simd_env_error().
std::atomic<const Kernels*>& active() {
  static std::atomic<const Kernels*> k{[] {
    const char* env = std::getenv("DKI_SIMD");
    try {
      return pick(env ? env : "auto");
    } catch (const Error& e) {
      env_error() = std::string("DKI_SIMD: ") + e.what();
      return pick("auto");
    }
  }()};
  return k;
}

bool cpu_is_intel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

int checked_prefetch(long long bytes) {
  if (bytes < 0 || bytes > kMaxPrefetchBytes)
    throw Error("prefetch distance " + std::to_string(bytes) + " is out of range (0 to " + std::to_string(kMaxPrefetchBytes) + " bytes)");
  return int(bytes);
}

int checked_streams(long long streams) {
  if (streams != 1 && streams != 2) throw Error("decode streams must be 1 or 2, not " + std::to_string(streams));
  return int(streams);
}

// The whole number in environment variable `name`, passed through `checked` (which throws when it
// is out of range); `fallback` when unset, and when bad too, after recording why: the addon's load
// then fails with that reason.
int env_setting(const char* name, int fallback, int (*checked)(long long)) {
  const char* env = std::getenv(name);
  if (!env) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  try {
    if (*env == '\0' || *end != '\0') throw Error(std::string("\"") + env + "\" is not a whole number");
    return checked(v);
  } catch (const Error& e) {
    if (env_error().empty()) env_error() = std::string(name) + ": " + e.what();
    return fallback;
  }
}

std::atomic<int>& prefetch() {
  static std::atomic<int> p{env_setting("DKI_PREFETCH", cpu_is_intel() ? 8192 : 0, checked_prefetch)};
  return p;
}

std::atomic<int>& streams() {
  static std::atomic<int> n{env_setting("DKI_DECODE_STREAMS", cpu_is_intel() ? 2 : 1, checked_streams)};
  return n;
}

}  // namespace

const Kernels& kernels() { return *active().load(std::memory_order_relaxed); }

void set_simd(const std::string& name) { active().store(pick(name)); }

void check_simd(const std::string& name) { pick(name); }

const std::string& simd_env_error() {
  active();
  prefetch();
  streams();
  return env_error();
}

int prefetch_bytes() { return prefetch().load(std::memory_order_relaxed); }

void set_prefetch_bytes(int bytes) { prefetch().store(checked_prefetch(bytes)); }

int decode_streams() { return streams().load(std::memory_order_relaxed); }

void set_decode_streams(int n) { streams().store(checked_streams(n)); }

std::vector<std::string> available_simd() {
  std::vector<std::string> out{"scalar"};
  if (cpu_has_avx2()) out.push_back("avx2");
  if (cpu_has_avx512_vnni()) out.push_back("avx512");
  if (cpu_has_amx()) out.push_back("amx");
  return out;
}

}  // namespace dki
